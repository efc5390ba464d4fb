"""Can the tiny model learn the tool task? A supervised warm-up on expert demonstrations of ToolArithmetic-v0.

The expert calls the calculator on the question's expression, then answers with the tool's output. Its episodes
are recorded by the episode driver (token-exact, loss mask on the assistant's tokens only) and the built-in tiny
model (random init) is trained on them with cross-entropy; held-out success, the rate of valid tool calls and the
mean number of turns are measured with greedy episodes before and after. This is imitation, not reinforcement
learning: it shows that the task is within the tiny model's reach and gives RL a policy that uses the tool.

    PYTHONPATH=src python examples/multiturn/sft_tool_arithmetic.py      # the defaults are the run in docs/multiturn.md

``--save DIR`` writes the warmed-up model and its tokenizer (chat template included) as a Hugging Face model
directory, which ``model.name: DIR`` loads as the starting policy of an RL run (docs/multiturn.md, "Training").

``--memory-fraction F`` makes a share F of the demonstrations come from an expert who answers from memory, with
the right number and no tool call: imitation then learns both behaviours, and whether a question gets the
calculator is left to the policy. The tiny model cannot multiply in its head, so its answers from memory are
wrong; RL on such a warm-up has to learn to call the tool (docs/multiturn.md, "Measured: RL on the tool task
(CPU)").
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lmpo.envs import EpisodeBudget, make_env, make_env_task
from lmpo.generation.episodes import HFTurnSampler, collate_episodes, episode_metrics, run_episodes
from lmpo.models import build_chat_tokenizer, build_tiny_model
from lmpo.models.saving import write_hf_files

ENV = "ToolArithmetic-v0"


def answers_from_memory():
    """ToolArithmetic-v0 whose expert answers at once with the right number (no calculator call)."""
    return make_env(ENV, expert="memory")


def evaluate(model, tokenizer, examples, budget, show: int = 0) -> dict[str, float]:
    episodes = run_episodes(HFTurnSampler(model, tokenizer, temperature=0.0), tokenizer, ENV, examples, budget=budget)
    for e in episodes[:show]:
        print(json.dumps(e.messages), flush=True)
    metrics = {"episodes/success_rate": 0.0, **episode_metrics(episodes)}  # no judged turn at all: no success
    return {k.removeprefix("episodes/"): round(v, 4) for k, v in metrics.items()
            if k in ("episodes/success_rate", "episodes/tool_call_valid_rate", "episodes/turns_mean",
                     "episodes/tool_calls_mean", "episodes/truncated_fraction")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-examples", type=int, default=4000)
    parser.add_argument("--eval-examples", type=int, default=50)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--episodes-per-step", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--memory-fraction", type=float, default=0.0,
                        help="share of the demonstrations that answer from memory, without the calculator")
    parser.add_argument("--show", type=int, default=3, help="held-out conversations printed after training")
    parser.add_argument("--save", default=None, help="write the trained model and tokenizer to this directory")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.monotonic()

    tokenizer = build_chat_tokenizer()
    model = build_tiny_model(tokenizer, seed=args.seed)
    task = make_env_task(ENV)
    budget = EpisodeBudget(max_turns=4, max_total_tokens=256, max_new_tokens_per_turn=96)
    held_out = task.eval_examples()[: args.eval_examples]
    before = evaluate(model, tokenizer, held_out, budget)
    print(f"[{time.monotonic() - start:.0f}s] held-out before: {before}", flush=True)

    if not 0.0 <= args.memory_fraction <= 1.0:
        parser.error(f"--memory-fraction {args.memory_fraction} must be in [0, 1]")
    examples = task.train_examples(seed=args.seed)[: args.train_examples]
    from_memory = round(args.memory_fraction * len(examples))
    # every k-th demonstration answers from memory, so both kinds cover the whole range of questions
    memory_rows = set(torch.linspace(0, len(examples) - 1, from_memory).round().long().tolist()) if from_memory else set()
    demos = run_episodes(None, tokenizer, ENV, [x for i, x in enumerate(examples) if i not in memory_rows],
                         expert=True, budget=budget)
    if memory_rows:
        demos += run_episodes(None, tokenizer, answers_from_memory, [examples[i] for i in sorted(memory_rows)],
                              expert=True, budget=budget)
    batch = collate_episodes(demos, tokenizer.pad_token_id)
    input_ids, attention = batch.input_ids, batch.full_attention_mask
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    P = batch.prompt_ids.shape[1]
    # (B, P + T): the loss is on the token at t+1 predicted at t, for the assistant's tokens only
    targets = torch.cat([torch.zeros_like(batch.prompt_ids), batch.loss_mask], dim=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 20) * (1 - s / args.steps))
    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    losses = []
    for _ in range(args.steps):
        rows = torch.randint(len(batch), (args.episodes_per_step,), generator=generator)
        logits = model(input_ids=input_ids[rows], attention_mask=attention[rows], position_ids=positions[rows]).logits
        mask = targets[rows, 1:].float()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), input_ids[rows, 1:], reduction="none")
        loss = (nll * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if len(losses) % 25 == 0:
            print(f"[{time.monotonic() - start:.0f}s] step {len(losses)}: loss {sum(losses[-25:]) / 25:.4f}", flush=True)
    model.eval()
    if args.save:
        write_hf_files(args.save, model, tokenizer)
    after = evaluate(model, tokenizer, held_out, budget, show=args.show)
    print(json.dumps({
        "demonstrations": len(demos), "from_memory": len(memory_rows), "demo_tokens_per_episode": round(batch.attention_mask.sum().item() / len(demos), 1),
        "prompt_width": P, "steps": args.steps, "episodes_per_step": args.episodes_per_step, "lr": args.lr,
        "loss_first_10": round(sum(losses[:10]) / 10, 4), "loss_last_10": round(sum(losses[-10:]) / 10, 4),
        "held_out_before": before, "held_out_after": after, "eval_examples": len(held_out),
        "wall_s": round(time.monotonic() - start, 1), "threads": args.threads,
    }, indent=1))


if __name__ == "__main__":
    main()
