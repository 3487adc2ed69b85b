"""A worker on gevent (celery:gevent): `python -m crashbench.run.gevent_worker SPEC NAME LEDGER PARENT`.

gevent's monkey patching must come before socket, threading, time or redis are imported, or the
greenlets of a gevent pool block each other on the unpatched calls (Celery's own `celery worker -P
gevent` patches first thing, too). A worker forked from crashbench cannot have that (its parent
imported redis long ago), so the harness execs this module in a fresh interpreter (Design.worker_module,
crashbench.control.interpreter): it patches, then runs the worker as crashbench.run.worker's main does.
It imports nothing else first.
"""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402  (after the patching, on purpose)

from crashbench.run.worker import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
