"""Control of the processes and servers crashbench starts, as Jepsen's control and db layers: the
embedded server and cluster and the server a session runs on, connections and the run's lease on a
server, the worker supervisor with its zygote and reaper, the fault proxy's process, work directories
and signal flags. Below the designs, the evidence and the faults, which all drive these."""
