"""Tasks: prompts with verifiable answers. Built-in synthetic tasks (registry ``TASKS``), local
JSON/JSONL/Parquet files and Hugging Face datasets (TRL's standard or conversational format), each with a
held-out evaluation split; conversational prompts are rendered by the policy's chat template
(``render_prompts``).

>>> task = make_task("addition", max_digits=2)
>>> train, held_out = task.train_examples(seed=0), task.eval_examples()
>>> train[0].prompt, train[0].answer      # ('5+9=', '14')
"""

from lmpo.tasks import synthetic, thinking  # noqa: F401  (registers the built-in tasks; thinking: RLVCR)
from lmpo.tasks.base import TASKS, Example, ListTask, Task, make_task, register_task
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

__all__ = [
    "FILE_FORMATS",
    "PROMPT_FORMATS",
    "TASKS",
    "AdditionTask",
    "CountdownTask",
    "Example",
    "GeneratedTask",
    "ListTask",
    "ReversalTask",
    "Task",
    "is_conversation",
    "load_file_task",
    "load_hf_task",
    "load_task",
    "make_task",
    "register_task",
    "render_conversation",
    "render_prompts",
    "rows_to_examples",
    "split_examples",
    "task_from_rows",
]
