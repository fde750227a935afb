"""Rendering a tokenizer's chat template from outside, bounded in time, memory and output.

A chat template is a Jinja program shipped in the tokenizer's files (an artifact's `tokenizer/`).
transformers renders it in Jinja's sandbox, which stops attribute tricks (a SecurityError) but
not work: `{{ 'x' * 3000000000 }}` allocates gigabytes in one step and nested `range(100000)`
loops run for hours, neither interruptible from inside the process. So the template is rendered
in a forked child (the tokenizer is already loaded, nothing is imported again) under an address
space limit, killed past a deadline, and its text is taken only up to a size limit; the parent
then tokenizes the text as `apply_chat_template(tokenize=True)` would. Every way it fails is one
ArtifactError naming the tokenizer's template. A template itself larger than
`MAX_TEMPLATE_BYTES` is refused before any of that (template files are bounded before transformers
reads them too: `qnn_common.torchio.hf_untrusted`). Infer renders the user's prompt with it; prepare
renders the chat-formatted calibration texts of an instruct model.
"""

from __future__ import annotations

import multiprocessing
import resource
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from qnn_common.errors import ArtifactError
from qnn_common.torchio.hf_untrusted import MAX_TEMPLATE_BYTES

TIMEOUT_S = 10.0
MEMORY_BYTES = 1 << 30  # the child's address space beyond what it inherits
_BASE_OUTPUT = 1 << 20  # template text around the prompt (system prompts, tool schemas)


def render_chat_prompt(tokenizer: Any, prompt: str, where: Path) -> str:
    """The user turn `prompt` through `tokenizer`'s chat template, with the generation prompt.

    `where` names the template's files in errors. Refused: a template that takes longer than
    TIMEOUT_S, needs more than MEMORY_BYTES, renders more than 1 MiB besides twice the prompt,
    is itself larger than MAX_TEMPLATE_BYTES, or fails (a Jinja error, a sandbox SecurityError).
    """
    return render_chat(tokenizer, [{"role": "user", "content": prompt}], where,
                       add_generation_prompt=True)


def render_chat(
    tokenizer: Any, messages: Sequence[dict[str, str]], where: Path, *,
    add_generation_prompt: bool,
) -> str:
    """`messages` (role / content turns) through `tokenizer`'s chat template, bounded as
    `render_chat_prompt` says (1 MiB besides twice the messages' text)."""
    _check_template_size(tokenizer, where)
    limit = _BASE_OUTPUT + 2 * sum(len(m["content"].encode("utf-8")) for m in messages)
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_render, args=(send, tokenizer, list(messages), add_generation_prompt, limit),
        daemon=True,
    )
    child.start()
    send.close()
    try:
        if not receive.poll(TIMEOUT_S):
            raise ArtifactError(
                where, f"the chat template did not render within {TIMEOUT_S:.0f} s (it loops "
                "or computes without bound); fix the template or drop --chat",
            )
        try:
            kind, text = receive.recv()
        except EOFError:  # the child died without a word: killed, or out of memory in C
            kind, text = "error", f"the renderer died (exit {child.exitcode})"
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    if kind != "ok":
        raise ArtifactError(
            where, f"the chat template cannot be rendered: {text}; fix the template or drop --chat"
        )
    return str(text)


def _check_template_size(tokenizer: Any, where: Path) -> None:
    """Refuse a template past MAX_TEMPLATE_BYTES before Jinja parses it: parsing costs about
    twice the template's size, before the deadline or the memory limit can stop it."""
    template = getattr(tokenizer, "chat_template", None)
    templates = template.values() if isinstance(template, dict) else [template]
    size = sum(len(t.encode("utf-8")) for t in templates if isinstance(t, str))
    if size > MAX_TEMPLATE_BYTES:
        raise ArtifactError(
            where, f"the chat template is {size / 2**20:.1f} MiB, more than the "
            f"{MAX_TEMPLATE_BYTES >> 20} MiB a template may be (published ones are kilobytes); "
            "replace it with the model's real template or drop --chat",
        )


def _render(
    send: Connection, tokenizer: Any, messages: list[dict[str, str]],
    add_generation_prompt: bool, limit: int,
) -> None:
    """In the child: render, and send ("ok", text) or ("error", what went wrong)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            inherited = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (inherited + MEMORY_BYTES, inherited + MEMORY_BYTES))
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        if not isinstance(text, str):
            send.send(("error", f"it rendered a {type(text).__name__}, not text"))
        elif len(text) > limit:
            send.send(("error", f"it renders {len(text)} characters, more than {limit}"))
        else:
            send.send(("ok", text))
    except MemoryError:
        send.send(("error", f"it needs more than {MEMORY_BYTES >> 20} MiB of memory"))
    except Exception as err:  # a Jinja TemplateError, a SecurityError, whatever the template raises
        send.send(("error", f"{type(err).__name__}: {str(err)[:300]}"))
    finally:
        send.close()
