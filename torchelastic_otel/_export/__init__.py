"""The export pipeline: the state machine that builds it, its providers, bounded buffers, the drainer and the
fork gate exports hold."""
