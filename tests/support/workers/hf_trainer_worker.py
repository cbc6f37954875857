"""A tiny Hugging Face ``Trainer`` job (2 ranks under torchrun, CPU, gloo) that writes its own ground truth.

A 2-layer GPT-2 built from a small config (no download, no hub), random token data; ``Trainer`` runs
``FRAMEWORK_STEPS`` optimizer steps and saves a checkpoint every ``FRAMEWORK_SAVE_EVERY`` steps (its
``save_steps``: the optimizer, scheduler and each rank's RNG state go through ``torch.save``). It never imports the
bridge. A ``TrainerCallback`` writes ``<FRAMEWORK_OUT>/rank<R>.json`` at the end of training: the steps the
``Trainer`` ran on this rank (``global_step`` at each ``on_step_end``), the ``global_step`` of each save,
whether this rank wrote files of its own at each save (``writes``: its ``rng_state_<process_index>.pth``, found on
disk after training) and, where it did, the files of each save's checkpoint directory with their sizes (``files``).

It also writes, at each log call, ``<FRAMEWORK_OUT>/logged-rank<R>-attempt<A>.json``: the ``Trainer``'s own
``state.log_history`` so far on this rank and attempt (``TORCHELASTIC_RESTART_COUNT``). ``FRAMEWORK_EVAL=1``
evaluates every ``FRAMEWORK_SAVE_EVERY`` steps on a small random set; ``FRAMEWORK_FAIL_ONCE=<marker path>``: rank 1
raises at step ``FRAMEWORK_FAIL_AT`` (default 7) unless the marker exists, which it creates first (one failure).
"""

from __future__ import annotations

import os

# no network, ever: offline hub, no telemetry, no tokenizer download (the model comes from a config)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers
from _framework import ATTEMPT, EVALUATE, OUT, RANK, SAVE_EVERY, STEPS, fail_once, write

VOCAB, LENGTH = 128, 32


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[misc]
    """Random token sequences, the same on every rank (the sampler shards them); labels = inputs (causal LM)."""

    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, VOCAB, (size, LENGTH), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class GroundTruth(transformers.TrainerCallback):  # type: ignore[misc]
    """What the ``Trainer`` itself says it did on this rank."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.saves: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.steps.append(state.global_step)
        fail_once(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        write(f"logged-rank{RANK}-attempt{ATTEMPT}.json", {"log_history": state.log_history})

    def on_save(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.saves.append(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        directories = {step: os.path.join(args.output_dir, f"checkpoint-{step}") for step in self.saves}
        own = [os.path.join(d, f"rng_state_{args.process_index}.pth") for d in directories.values()]
        writes = bool(own) and all(os.path.isfile(path) for path in own)
        files = {step: _sizes(d) for step, d in directories.items()} if writes else {}
        record = {"rank": RANK, "steps": len(self.steps), "global_step": state.global_step, "saves": self.saves,
                  "writes": writes, "files": files}  # fmt: skip
        write(f"rank{RANK}.json", record)


def _sizes(directory: str) -> dict[str, int]:
    """The files of a checkpoint's directory and their sizes."""
    return {name: os.path.getsize(os.path.join(directory, name)) for name in sorted(os.listdir(directory))}


def main() -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=LENGTH, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=os.path.join(OUT, "trainer"),
        max_steps=STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_steps=SAVE_EVERY,
        logging_steps=5,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        ddp_backend="gloo",
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
        seed=0,
        **({"eval_strategy": "steps", "eval_steps": SAVE_EVERY, "per_device_eval_batch_size": 4} if EVALUATE else {}),
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=RandomTokens(256), callbacks=[GroundTruth()],
                                   eval_dataset=RandomTokens(16) if EVALUATE else None)  # fmt: skip
    trainer.train()


if __name__ == "__main__":
    main()
