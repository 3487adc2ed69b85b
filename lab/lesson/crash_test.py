# The lesson's crash test, verbatim from shared/seeds/000 but for the server port (bench only).
import os, subprocess, sys, time, signal
import redis
from rq import enqueue, reap
r = redis.Redis(port=int(os.environ["LESSON_REDIS_PORT"]), decode_responses=True)
PY = sys.executable
def run(kind):
    q = f"q:{kind}"
    for k in r.scan_iter(f"{q}*"): r.delete(k)
    r.delete("done")
    for i in range(2000): enqueue(q, i, {"n": i})
    procs = [subprocess.Popen([PY, "rq.py", kind, q, f"w{i}"]) for i in range(4)]
    for round_ in range(5):                       # every 0.5 s, kill -9 one worker and start a new one
        time.sleep(0.5)
        victim = procs.pop(0); victim.send_signal(signal.SIGKILL); victim.wait()
        procs.append(subprocess.Popen([PY, "rq.py", kind, q, f"w{4 + round_}"]))
    for p in procs: p.wait()
    requeued = [0, 0]
    if kind == "reliable":
        time.sleep(3.2)
        requeued = reap(q, stale_after=3)
        p = subprocess.Popen([PY, "rq.py", kind, q, "cleanup"]); p.wait()
    print(f"{kind:8}: 2000 jobs, 5 workers SIGKILLed -> done {r.scard('done')}, "
          f"lost {2000 - r.scard('done')}, requeued by reaper {requeued[0]}, dead-lettered {requeued[1]}")
run("naive")
run("reliable")
