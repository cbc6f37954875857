"""The process's life: fork, signals, exit and stacks -- the only code that touches them."""
