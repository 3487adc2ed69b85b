"""Reports of a result to look at: a self-contained HTML page (crashbench.report.html) and small SVG
charts (crashbench.report.svg). Core code: no click, no rich."""
