# The lesson's queue module, verbatim from shared/seeds/000 but for the server port (bench only).
"""Two list-based queues: naive (BLPOP) and reliable (BLMOVE + per-worker processing list + reaper)."""
import json, os, sys, time
import redis

r = redis.Redis(port=int(os.environ["LESSON_REDIS_PORT"]), decode_responses=True)

def enqueue(q, job_id, payload):
    r.lpush(f"{q}:pending", json.dumps({"id": job_id, "payload": payload, "attempts": 0}))

def do_work(job):
    time.sleep(0.01)                                   # 10 ms of "work"
    r.sadd("done", job["id"])                          # the side effect (idempotent: a set)

def naive_worker(q):
    while True:
        item = r.brpop(f"{q}:pending", timeout=1)
        if item is None: return
        do_work(json.loads(item[1]))

def reliable_worker(q, name):
    proc = f"{q}:processing:{name}"
    r.hset(f"{q}:heartbeats", name, int(time.time()))
    while True:
        raw = r.blmove(f"{q}:pending", proc, timeout=1, src="RIGHT", dest="LEFT")
        if raw is None: return
        r.hset(f"{q}:heartbeats", name, int(time.time()))
        do_work(json.loads(raw))
        r.lrem(proc, 1, raw)                           # ack: remove exactly this item

REQUEUE = """
-- move everything from a dead worker's processing list back to pending (or to dead letters)
local moved, dead = 0, 0
while true do
  local raw = redis.call('RPOP', KEYS[1])
  if not raw then break end
  local job = cjson.decode(raw)
  job.attempts = job.attempts + 1
  if job.attempts > tonumber(ARGV[1]) then
    redis.call('LPUSH', KEYS[3], cjson.encode(job)); dead = dead + 1
  else
    redis.call('RPUSH', KEYS[2], cjson.encode(job)); moved = moved + 1   -- RPUSH: retried first
  end
end
return {moved, dead}
"""

def reap(q, stale_after=3, max_attempts=3):
    """Run periodically: requeue jobs held by workers whose heartbeat is older than stale_after seconds."""
    total = [0, 0]
    for name, beat in r.hgetall(f"{q}:heartbeats").items():
        if time.time() - int(beat) > stale_after:
            moved, dead = r.eval(REQUEUE, 3, f"{q}:processing:{name}", f"{q}:pending", f"{q}:dead", max_attempts)
            total[0] += moved; total[1] += dead
            r.hdel(f"{q}:heartbeats", name)
    return total

if __name__ == "__main__":
    kind, q = sys.argv[1], sys.argv[2]
    naive_worker(q) if kind == "naive" else reliable_worker(q, sys.argv[3])
