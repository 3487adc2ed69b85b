"""What a person reads of a result: the results store, rich tables, exports (JUnit, Markdown, CSV), the
self-contained HTML report with its SVG charts, and a saved result recounted and re-judged. Core code:
no click, no rich (but render.py, which the CLI calls)."""
