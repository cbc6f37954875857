"""Scripts the tests run by path: torchrun workers and child programs (``tests.support.WORKERS``)."""
