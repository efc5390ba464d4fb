"""TextArena's single-player games as lmpo environments (optional extra: ``pip install 'lmpo[textarena]'``).

`TextArena <https://github.com/LeonGuertler/TextArena>`_ is a suite of text games written for evaluating and
training language-model agents. The adapter plays the game unchanged through its own API (``textarena.make``,
``reset(num_players=1, seed=…)``, ``get_observation``, ``step``, ``close``) and only translates: the game's
messages become chat messages, its end-of-game reward becomes the reward of the last turn.

The ``-raw`` variant of a game is used (no TextArena wrappers), so that each observation holds only the new
messages: the episode driver keeps the conversation itself, where TextArena's default wrappers would repeat the
whole history in every observation. Games registered here are ``textarena/<Game>-vN`` (:data:`GAMES`); any other
single-player game runs as ``TextArenaEnv(game="<Game>-vN")``.

TextArena seeds Python's global ``random`` module in ``reset`` and draws from it during the game. The adapter
gives each environment its own ``random`` state, swapped in around every TextArena call and out again, so
that episodes are reproducible from their seed and the caller's global random stream is left as it was.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from lmpo.envs.adapters import SeedTask, import_extra
from lmpo.envs.base import LMEnv, Message, StepResult, register_env
from lmpo.errors import InputError
from lmpo.tasks.base import Example

#: single-player TextArena games registered as ``textarena/<game>`` (checked with ``check_env`` in the tests;
#: Wordle and Hangman are left out because their word lists are downloaded by ``nltk`` on first use)
GAMES = ("GuessTheNumber-v0", "Mastermind-v0", "TowerOfHanoi-v0", "FifteenPuzzle-v0", "Minesweeper-v0",
         "LightsOut-v0")
PLAYER = 0



def import_textarena():
    """The ``textarena`` module, or InputError saying how to install it."""
    return import_extra("textarena", "textarena", "TextArena environments")


class TextArenaTask(SeedTask):
    """Game instances as examples: an example is a seed (``meta["seed"]``). The held-out split is seeds
    ``0 … num_eval−1``; training seeds are drawn from ``[10**6, 2**31)``, so the two never overlap."""

    def __init__(self, game: str = "GuessTheNumber-v0", num_train: int = 10_000, num_eval: int = 100) -> None:
        super().__init__(f"textarena/{game}", num_train, num_eval)
        self.game = game


class TextArenaEnv(LMEnv):
    """A single-player TextArena game, played unchanged.

    ## Description
    Wraps ``textarena.make("<game>-raw")``. The game draws its instance (the secret number, the board…) from the
    seed: ``reset(example)`` uses ``example.meta["seed"]`` (examples from ``TextArenaTask``), ``reset(None,
    seed)`` the given seed.

    ## Observations
    The opening is one user message: the game's prompt for player 0 (rules and the answer format) and any board
    it shows, joined by newlines, after ``system_prompt`` as a system message when one is given. After each
    turn, one user message with the game's new messages (hints, boards, invalid-move notices), the player's own
    action left out; the last turn of a game may have none.

    ## Actions
    Any text, passed to the game's ``step`` unchanged; each game parses its own format (``[5]`` for a guess in
    GuessTheNumber). TextArena answers an invalid move with a notice and ends the game at the second one in a
    row (its ``error_allowance``).

    ## Rewards
    0.0 on every turn but the last; the last turn gets the game's reward for player 0 (``close()``'s rewards:
    1 for a win, a game-specific value in [−1, 1] otherwise, e.g. GuessTheNumber's closeness of the last guess).
    ``info["game_info"]`` at the end holds TextArena's reason and invalid-move flag; ``info["correct"]`` is
    whether the game was won (reward 1), so success rates count wins, not partial credit.

    ## Episode End
    Terminated when the game says it is done (won, lost, its own turn limit, repeated invalid moves). Never
    truncated by the adapter: the episode driver's budgets cut games that run long.

    ## Version
    v0: first version (tested with textarena 0.7.4).

    ## Expert
    GuessTheNumber has one (``GuessTheNumberEnv.expert_action``: bisection on the interval its hints leave);
    the other games have none, so ``sft.steps`` cannot warm up on them.

    Args:
        game: a TextArena single-player game id (``GuessTheNumber-v0``; the ``-raw`` variant is made).
        system_prompt: an optional system message before the game's prompt.
        game_options: keyword options of the game's constructor (``max_turns=…`` etc.).
    """

    def __init__(self, game: str = "GuessTheNumber-v0", system_prompt: str | None = None, **game_options: Any) -> None:
        super().__init__()
        ta = import_textarena()
        raw = game if game.endswith("-raw") else f"{game}-raw"
        if raw not in ta.envs.registration.ENV_REGISTRY:
            raise InputError(f"TextArena has no game {game!r} (looked for {raw!r}); see textarena.envs.registration."
                             "ENV_REGISTRY for the names.")
        self.game, self.system_prompt = game, system_prompt
        self._ta = ta
        self._env = ta.make(raw, **game_options)
        self._rng_state: Any = None
        self._done = True

    def _in_own_random(self, call: Callable[[], Any]) -> Any:
        outer = random.getstate()
        if self._rng_state is not None:
            random.setstate(self._rng_state)
        try:
            return call()
        finally:
            self._rng_state = random.getstate()
            random.setstate(outer)

    def _new_messages(self) -> list[str]:
        player, messages = self._env.get_observation()
        action = self._ta.ObservationType.PLAYER_ACTION
        return [text for sender, text, kind in messages if not (sender == PLAYER and kind == action) and text.strip()]

    def reset(self, example: Example | None = None, seed: int | None = None) -> tuple[list[Message], dict]:
        super().reset(example, seed)
        game_seed = example.meta.get("seed") if example is not None else None
        if game_seed is None:
            game_seed = seed if seed is not None else int(self.np_random.integers(2**31))
        self._rng_state = None

        def start() -> list[str]:
            self._env.reset(num_players=1, seed=game_seed)
            return self._new_messages()

        texts = self._in_own_random(start)
        self._done = False
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*opening, {"role": "user", "content": "\n".join(texts)}], {"game_seed": game_seed}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError(f"{self.env_id or self.game}: step() called before reset() or after the game ended")

        def play() -> tuple[bool, dict, list[str]]:
            done, step_info = self._env.step(action)
            return done, step_info, self._new_messages()

        done, step_info, texts = self._in_own_random(play)
        info: dict[str, Any] = {"textarena": dict(step_info or {})}
        if not done:
            observation = [{"role": "user", "content": "\n".join(texts) or "Your move."}]
            return StepResult(observation, 0.0, False, False, info)
        self._done = True
        rewards, game_info = self._in_own_random(self._env.close)
        info["game_info"] = (game_info or {}).get(PLAYER, {})
        reward = float((rewards or {}).get(PLAYER, 0.0))
        info["correct"] = reward >= 1.0
        observation = [{"role": "user", "content": "\n".join(texts)}] if texts else []
        return StepResult(observation, reward, True, False, info)


class GuessTheNumberEnv(TextArenaEnv):
    """TextArena's GuessTheNumber with a scripted expert: bisection on the interval the game's hints leave
    (``guess_history`` holds each guess with the hint the player was shown), which wins 1..20 within five
    guesses. The demonstrations of ``sft.steps``."""

    def expert_action(self) -> str:
        if self._done:
            raise RuntimeError(f"{self.env_id or self.game}: expert_action() called before reset() or after the end")
        game = self._env
        low, high = game.min_number, game.max_number
        for guess, hint in game.state.game_state["guess_history"]:
            low, high = (max(low, guess + 1), high) if hint == "higher" else (low, min(high, guess - 1))
        return f"[{(low + high) // 2}]"


GuessTheNumberEnv.__doc__ += "\n\n" + TextArenaEnv.__doc__[TextArenaEnv.__doc__.index("    ## Description"):]

#: the games registered with a scripted expert, by game id (the others are plain ``TextArenaEnv``)
EXPERT_GAMES: dict[str, type[TextArenaEnv]] = {"GuessTheNumber-v0": GuessTheNumberEnv}


def _register_games() -> None:
    for game in GAMES:
        def factory(_game: str = game, **options: Any) -> TextArenaEnv:
            return EXPERT_GAMES.get(_game, TextArenaEnv)(_game, **options)

        def task(_game: str = game, **options: Any) -> TextArenaTask:
            return TextArenaTask(_game, **options)

        card = TextArenaEnv.__doc__[TextArenaEnv.__doc__.index("    ## Description"):]
        factory.__doc__ = f"TextArena's {game.rsplit('-v', 1)[0]}, played unchanged.\n\n{card}"
        register_env(f"textarena/{game}", task=task, requires="textarena")(factory)


_register_games()
