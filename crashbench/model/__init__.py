"""The records at the bottom of crashbench: what a run is asked to do and what it did, as plain data.
Every other package may import these; they import nothing of crashbench above them, nor redis,
psutil, click or rich (tests/test_layers.py holds both). `spec`, the scenario's settings, one record
per section (`sections`); `timeline`, the history (with `ledger` and `executions`, what each handler
did); `results`, the typed results and their JSON; `thresholds`, what a design is expected to do;
`faults`, faults planned and as executed; `queue`, what a design takes and gives (Job, DesignSettings,
QueueState, Located); `stored`, the harness's own reading of Redis (StoredKey, Snapshot, Consumer);
`server`, the server a session runs on; `workload`, what each job does, from its id and the seed;
`counts`, the counts and the evidence problems of a run; `bench`, crashbench bench's results.
"""
