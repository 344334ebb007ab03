"""Stopping from inside the trainer: the Hugging Face TrainerCallback on a tiny offline Trainer run.

The model is built from a config (no download); the data are random token ids whose label is the
first token modulo 3, so evaluation metrics move. The callback's per-checkpoint numbers are compared
with ``wbfe watch`` reading the checkpoints the same Trainer saved at the same steps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from wbfe.errors import InvalidOptionError

transformers = pytest.importorskip("transformers", reason="transformers (a test dependency) not installed")


def _trainer(out: Path, callback: Any, *, max_steps: int, save: bool) -> Any:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16, num_labels=3)
    model = BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(1)

    class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self, n: int) -> None:
            self.ids = torch.randint(0, 40, (n, 8), generator=g)

        def __len__(self) -> int:
            return len(self.ids)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.ids[i], "labels": int(self.ids[i, 0]) % 3}

    def accuracy(pred: Any) -> dict[str, float]:
        return {"accuracy": float(np.mean(np.argmax(pred.predictions, axis=-1) == pred.label_ids))}

    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=8,
                             learning_rate=5e-3, eval_strategy="steps", eval_steps=2,
                             save_strategy="steps" if save else "no", save_steps=2, logging_steps=2,
                             report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=Data(64), eval_dataset=Data(24), compute_metrics=accuracy,
                   callbacks=[callback])


def test_trainer_callback_records_what_wbfe_watch_reads_from_the_saved_checkpoints(tmp_path: Path) -> None:
    from wbfe.watch import trainer_callback
    from wbfe_cli.main import app

    callback = trainer_callback(tmp_path / "w", rule="last")
    trainer = _trainer(tmp_path / "out", callback, max_steps=6, save=True)
    trainer.train()
    recorded = json.loads((tmp_path / "w" / "watch.json").read_text())
    assert [c["step"] for c in recorded["checkpoints"]] == [2, 4, 6]
    history = {h["step"]: h for h in trainer.state.log_history if "eval_loss" in h}
    assert [c["test_loss"] for c in recorded["checkpoints"]] == [history[s]["eval_loss"] for s in (2, 4, 6)]
    assert [c["test_accuracy"] for c in recorded["checkpoints"]] == [history[s]["eval_accuracy"] for s in (2, 4, 6)]
    assert recorded["recommended"]["step"] == 6 and recorded["stopping_rule"]["name"] == "last"
    assert callback.state.fired_at is None  # keeping the last never fires
    # wbfe watch on the Trainer's own checkpoint-N folders and trainer_state.json: the same numbers.
    out = CliRunner().invoke(app, ["watch", str(tmp_path / "out"), "--rule", "last", "-f", "json", "--device", "cpu"])
    assert out.exit_code == 0, out.output
    read = json.loads(out.stdout)
    assert [c["step"] for c in read["checkpoints"]] == [2, 4, 6]
    for mine, theirs in zip(recorded["checkpoints"], read["checkpoints"]):
        assert mine["test_loss"] == theirs["test_loss"] and mine["test_accuracy"] == theirs["test_accuracy"]
        assert [r["name"] for r in mine["layers"]] == [r["name"] for r in theirs["layers"]]
        for a, b in zip(mine["layers"], theirs["layers"]):
            for key in ("bfe", "htmp_kappa", "htmp_beta", "alpha"):
                assert (a[key] is None and b[key] is None) or a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9)
    assert set(recorded) == set(read)  # the same JSON shape as wbfe watch


def test_trainer_callback_stops_training_when_the_rule_fires(tmp_path: Path) -> None:
    from wbfe.watch import trainer_callback

    # At a tiny λ, h*(λ) = h*(1)/λ is huge: every checkpoint is on the over-fit side, the first one is
    # recommended and stays so; with patience 2 the rule fires at the third record (step 6 of 20).
    callback = trainer_callback(lam=1e-6, stop=True, patience=2)
    trainer = _trainer(tmp_path / "out", callback, max_steps=20, save=False)
    trainer.train()
    assert callback.state.fired_at == 6
    assert trainer.state.global_step == 6
    assert callback.state.result.recommendation.step == 2
    # Without stop=True it only records.
    passive = trainer_callback(lam=1e-6, patience=2)
    trainer = _trainer(tmp_path / "out2", passive, max_steps=10, save=False)
    trainer.train()
    assert trainer.state.global_step == 10 and passive.state.fired_at == 6


@pytest.mark.parametrize("kwargs, message", [
    ({"rule": "last", "lam": 1.0}, r"^lam: give either rule or lam \(the h\* rule at a λ\), not both$"),
    ({"patience": 0}, "patience must be a positive integer"),
    ({"rule": "nope"}, "unknown stopping rule 'nope'"),
])
def test_trainer_callback_options_are_checked_before_training(kwargs: dict[str, Any], message: str) -> None:
    from wbfe.watch import trainer_callback

    with pytest.raises(InvalidOptionError, match=message):
        trainer_callback(**kwargs)
