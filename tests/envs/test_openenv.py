"""The OpenEnv adapter with the real package: an OpenEnv server (openenv-core's FastAPI app under uvicorn) started
here on 127.0.0.1 at an ephemeral port, played through lmpo's environment protocol and trained on with
``lmpo train``."""

from __future__ import annotations

import random
import re
import threading
import time

import pytest
import yaml

from episode_helpers import ScriptedSampler
from lmpo.envs import EpisodeBudget, check_env, make_env, make_env_task
from lmpo.errors import InputError
from lmpo.generation.episodes import run_episodes
from lmpo.models import build_chat_tokenizer

pytest.importorskip("openenv")
uvicorn = pytest.importorskip("uvicorn")
from openenv.core.env_server.http_server import create_fastapi_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

ENV = "openenv/Remote-v0"
HIGH = 16


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    feedback: str = ""
    guesses_left: int = 0


class HotColdEnvironment(Environment):
    """Guess a number in 1..16 drawn from the reset seed; the server says higher or lower (an OpenEnv env)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.secret, self.left = 0, 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.secret, self.left = random.Random(seed).randint(1, HIGH), kwargs.get("guesses", 5)
        return GuessObservation(feedback=f"Guess my number between 1 and {HIGH}.", guesses_left=self.left)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        self.left -= 1
        numbers = re.findall(r"\d+", action.message)
        if not numbers:
            feedback, won = "Say a number.", False
        else:
            guess = int(numbers[-1])
            won = guess == self.secret
            feedback = "Correct!" if won else ("Higher." if guess < self.secret else "Lower.")
        done = won or self.left == 0
        return GuessObservation(feedback=feedback, guesses_left=self.left, done=done, reward=1.0 if won else 0.0)

    @property
    def state(self) -> State:
        return self._state


@pytest.fixture(scope="module")
def server():
    """The OpenEnv server on 127.0.0.1, port chosen by the OS; yields its base URL."""
    app = create_fastapi_app(HotColdEnvironment, GuessAction, GuessObservation, max_concurrent_envs=64)
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the OpenEnv server did not start"
        time.sleep(0.05)
    port = uv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(timeout=10)


def bisect(context: str, turn: int) -> str:
    low, high = 1, HIGH
    for guess, hint in re.findall(r"assistant\n(\d+)<\|im_end\|>\n<\|im_start\|>user\n(Higher|Lower)", context):
        low, high = (int(guess) + 1, high) if hint == "Higher" else (low, int(guess) - 1)
    return str((low + high) // 2)


def test_check_env_against_a_live_server(server):
    check_env(make_env(ENV, base_url=server), make_env_task(ENV, num_eval=3).eval_examples())
    check_env(make_env(ENV, base_url=server, observation_fields=["feedback"], reset_options={"guesses": 2}))


def test_scripted_bisection_wins_every_held_out_game(server):
    tok = build_chat_tokenizer()
    examples = make_env_task(ENV, num_eval=6).eval_examples()
    episodes = run_episodes(ScriptedSampler(tok, bisect), tok, lambda: make_env(ENV, base_url=server,
                            observation_fields=["feedback"], reset_options={"guesses": 5}), examples,
                            completions_per_example=2,
                            budget=EpisodeBudget(max_turns=6, max_total_tokens=800, max_new_tokens_per_turn=8))
    for e in episodes:
        assert e.end_reason == "terminated" and e.rewards[-1] == 1.0 and sum(e.rewards) == 1.0, e.messages
        assert e.messages[0] == {"role": "user", "content": f"Guess my number between 1 and {HIGH}."}
        assert e.messages[-1] == {"role": "user", "content": "Correct!"}
    secrets = {int(e.messages[-2]["content"]) for e in episodes}
    assert secrets == {random.Random(s).randint(1, HIGH) for s in range(6)}  # each seed reached the server


def test_observation_fields_and_json_actions(server):
    env = make_env(ENV, base_url=server, action_field=None)
    opening, info = env.reset(seed=3)
    assert opening == [{"role": "user", "content": f"feedback: Guess my number between 1 and {HIGH}.\nguesses_left: 5"}]
    assert "JSON object" in env.step("7").observation[0]["content"]  # a number is JSON, but not an object
    refused = env.step('{"guess": 7}')  # no field 'message': the server's action schema refuses it
    assert refused.info == {"invalid_action": True} and "refused" in refused.observation[0]["content"]
    answered = env.step('{"message": "7"}')
    assert answered.observation[0]["content"].startswith("feedback: ") and not answered.terminated
    env.close()


def test_base_url_is_required():
    with pytest.raises(InputError, match="env.options.base_url"):
        make_env(ENV)


@pytest.mark.slow  # ~2 s alone, ~8 s on 2 busy cores
def test_lmpo_train_two_steps_on_the_server(server, tmp_path):
    from lmpo.cli import main
    from lmpo.trainer.run.metrics import read_jsonl

    config = {
        "model": {"name": "tiny"},
        "env": {"id": ENV, "options": {"base_url": server, "observation_fields": ["feedback"]},
                "budget": {"max_turns": 3, "max_total_tokens": 200, "max_new_tokens_per_turn": 4},
                "chat_template": build_chat_tokenizer().chat_template},  # the tiny preset's tokenizer has none
        "task": {"eval_examples": 2, "options": {"num_eval": 2}},
        "rollout": {"completions_per_prompt": 2},
        "objective": {"preset": "grpo"},
        "loop": {"steps": 2, "prompts_per_step": 2, "seqs_per_microbatch": 4, "seed": 0, "device": "cpu",
                 "num_threads": 1},
        "eval": {"at_start": False}, "checkpoint": {"at_end": False},
        "logging": {"run_dir": str(tmp_path / "run"), "progress_bar": False, "tensorboard": False, "plots": False},
    }
    path = tmp_path / "openenv.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["train", str(path)]) == 0
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "episodes/turns_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["episodes/turns_mean"] >= 1 for r in rows)
