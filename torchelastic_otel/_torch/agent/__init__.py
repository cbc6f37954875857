"""The agent side of a torchrun job: its lifecycle (rendezvous, worker starts, failures, restarts) as spans."""
