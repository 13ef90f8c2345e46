"""The loop drives the engine's memory: it wakes the engine before every
step's rollouts, puts it to sleep before every policy update, and syncs the
trained adapter after it. Checked on the real tiny model with a recording
wrapper around the HF engine (whose sleep is a no-op), so the call order
the vLLM engine sees on a GPU is the one tested here."""
from __future__ import annotations

from lora_triplay.core.session import Session
from lora_triplay.recipe import build_recipe
from lora_triplay.training import grpo


class Recorder:
    """Forwards everything to the wrapped engine and logs the calls that
    matter for memory."""

    def __init__(self, engine, log):
        self._engine, self._log = engine, log

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, requests, sampling):
        self._log.append(("generate", sorted({r.adapter for r in requests})))
        return self._engine.generate(requests, sampling)

    def sleep(self):
        self._log.append(("sleep",))
        self._engine.sleep()

    def wake_up(self):
        self._log.append(("wake_up",))
        self._engine.wake_up()

    def sync_adapter(self, name):
        self._log.append(("sync", name))
        self._engine.sync_adapter(name)


def test_wake_before_rollouts_sleep_before_updates(tmp_path, tiny_model_dir, monkeypatch):
    log: list[tuple] = []
    real_make = Session._make_engine
    monkeypatch.setattr(Session, "_make_engine", lambda self: Recorder(real_make(self), log))
    real_step = grpo.GrpoLearner.step

    def recorded_step(self, samples, *args, **kwargs):
        log.append(("update",))
        return real_step(self, samples, *args, **kwargs)

    monkeypatch.setattr(grpo.GrpoLearner, "step", recorded_step)
    recipe = build_recipe({
        "model": {"base": tiny_model_dir, "device": "cpu", "dtype": "float32"},
        "lora": {"rank": 4, "alpha": 8},
        "phases": {"red": {"steps": 2}, "blue": {"steps": 1}, "eval": {"steps": 1}},
        "grpo": {"group_size": 2, "prompts_per_step": 2, "max_new_tokens": 6},
        "rewards": {"judge_mode": "choice", "embedding_model": "hashing"},
        "experts": {"safety_experts": 1, "utility_experts": 1},
        "engine": {"enable_sleep_mode": True},
    })
    session = Session.open(recipe, tmp_path / "run")
    log.clear()  # opening syncs nothing on HF; start from the first step
    session.run()
    updates = [i for i, c in enumerate(log) if c[0] == "update"]
    assert len(updates) >= 3  # red x2, blue (eval updates only once the panel has labelled pairs)
    awake = None
    for i, call in enumerate(log):
        if call[0] in ("sleep", "wake_up"):
            awake = call[0] == "wake_up"
        elif call[0] == "generate":
            assert awake, f"generate while asleep at call {i}: {log[max(0, i - 3): i + 1]}"
        elif call[0] == "update":
            assert awake is False, f"update while the engine is awake at call {i}: {log[max(0, i - 3): i + 1]}"
    # the trained adapter is synced after each update, before the next rollouts
    # (by its adapter name: the engine serves names as given)
    adapters = ["red", "red", "blue", "evaluator"]
    for u, adapter in zip(updates, adapters[: len(updates)]):
        nxt = log[u + 1 :]
        first_gen = next((k for k, c in enumerate(nxt) if c[0] == "generate"), len(nxt))
        assert ("sync", adapter) in nxt[:first_gen]
