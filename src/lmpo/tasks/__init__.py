"""Tasks: prompts with verifiable answers. Built-in synthetic tasks (registry ``TASKS``), local
JSON/JSONL/Parquet files and Hugging Face datasets (TRL's standard or conversational format), each with a
held-out evaluation split; conversational prompts are rendered by the policy's chat template
(``render_prompts``).

>>> task = make_task("addition", max_digits=2)
>>> train, held_out = task.train_examples(seed=0), task.eval_examples()
>>> train[0].prompt, train[0].answer      # ('5+9=', '14')
"""

from lmpo.tasks import synthetic, thinking  # noqa: F401  (registers the built-in tasks; thinking: RLVCR)
from lmpo.tasks.base import (
    TASK_FAMILIES,
    TASKS,
    Example,
    ListTask,
    Task,
    TaskFamily,
    make_task,
    register_task,
    register_task_family,
    task_family,
)
from lmpo.tasks.chat import PROMPT_FORMATS, is_conversation, render_conversation, render_prompts
from lmpo.tasks.files import (
    FILE_FORMATS,
    load_file_task,
    load_hf_task,
    load_task,
    rows_to_examples,
    split_examples,
    task_from_rows,
)
from lmpo.tasks.synthetic import AdditionTask, CountdownTask, GeneratedTask, ReversalTask

# reasoning-gym's generators as ``reasoning_gym/<dataset>`` (optional extra; the adapter is imported on first use)
register_task_family("reasoning_gym", "lmpo.envs.adapters.reasoning_gym:ReasoningGymTask", requires="reasoning_gym")

__all__ = [
    "FILE_FORMATS",
    "PROMPT_FORMATS",
    "TASKS",
    "TASK_FAMILIES",
    "AdditionTask",
    "CountdownTask",
    "Example",
    "GeneratedTask",
    "ListTask",
    "ReversalTask",
    "Task",
    "TaskFamily",
    "is_conversation",
    "load_file_task",
    "load_hf_task",
    "load_task",
    "make_task",
    "register_task",
    "register_task_family",
    "render_conversation",
    "render_prompts",
    "rows_to_examples",
    "split_examples",
    "task_family",
    "task_from_rows",
]
