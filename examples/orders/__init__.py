"""A small order service, crash-tested with crashbench (docs/tutorial-your-app.md).

Placing an order writes a row to SQLite and then does slower work (say, charging the card). The
naive task writes a new row every time it runs; the idempotent one writes the order's row once,
however many times it runs (INSERT OR IGNORE on the order id). Both exist for Celery (celery_app.py),
RQ (rq_tasks.py), Dramatiq (dramatiq_app.py), huey (huey_app.py), arq (arq_app.py), taskiq
(taskiq_app.py) and saq (saq_app.py); `check.rows` counts an order's rows: crashbench's --check.
"""
