"""The worker side of a torchrun job: final words, logging records, steps, collectives and stalls."""
