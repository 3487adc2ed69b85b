"""The records at the bottom of crashbench: what a run is asked to do and what it did, as plain data.

Every other package may import these; they import nothing of crashbench above them, nor redis,
psutil, click or rich (tests/test_layers.py holds both). Moving here, one record family at a time
(issue 27): `faults`, the worker, broker and network faults as executed; `queue`, what a design takes
and gives (Job, DesignSettings, QueueState, Located); `stored`, the harness's own reading of Redis
(StoredKey, Snapshot, Consumer); `workload`, what each job does, from its id and the seed;
`counts`, the counts and the evidence problems of a run.
"""
