"""Safe judge prompts and strict parsing of judge outputs (pure Python).

Two jobs, both about the evaluator being a single point of failure:

* Building judge prompts. Red's and blue's texts are adversarial by design;
  they enter a judge prompt only through :func:`data_block`, which wraps them
  in marker lines and :func:`neutralize`-s the content so that it cannot
  close the block early or forge a chat turn.
* Parsing judge answers. Parsing is strict on purpose: a lenient parser
  ("the first label word anywhere") lets eval hedge by naming every class and
  lets red's text, quoted back by the judge, choose the label. Anything
  ambiguous is an error with a reason, and the rewards treat it as malformed.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# eval's three classes (method.md): every module takes them from here
LABELS = ("negative", "rejective", "positive")

PARSE_ERRORS = ("empty", "no_label", "multiple_labels", "only_in_thinking", "truncated")
# eval's answers in choice mode (rewards.judge_mode: choice): one label line each
LABEL_CHOICES = tuple(f"Label: {c}" for c in LABELS)

# ---------------------------------------------------------------- thinking

_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)


def strip_thinking(text: str) -> tuple[str, str]:
    """Split ``text`` into (visible, thinking).

    ``<think>...</think>`` blocks are thinking. An unclosed ``<think>`` makes
    the rest of the text thinking (generation cut while reasoning). A
    ``</think>`` with no ``<think>`` before it makes everything before it
    thinking: several chat templates (DeepSeek-R1 distills, Qwen3 thinking
    variants) put the opening tag in the prompt, so the completion holds only
    the closing one.
    """
    text = _as_str(text)
    thinking: list[str] = []
    first_close, first_open = _THINK_CLOSE.search(text), _THINK_OPEN.search(text)
    if first_close and (first_open is None or first_close.start() < first_open.start()):
        thinking.append(text[: first_close.start()])
        text = text[first_close.end():]
    visible: list[str] = []
    while True:
        m_open = _THINK_OPEN.search(text)
        if m_open is None:
            visible.append(text)
            break
        visible.append(text[: m_open.start()])
        m_close = _THINK_CLOSE.search(text, m_open.end())
        if m_close is None:
            thinking.append(text[m_open.end():])
            break
        thinking.append(text[m_open.end(): m_close.start()])
        text = text[m_close.end():]
    return "".join(visible).strip(), "\n".join(t.strip() for t in thinking).strip()


# ------------------------------------------------------------ neutralizing
#
# Chosen escapes (readable for the judge, never equal to a delimiter or a
# special token, and idempotent so double neutralizing is harmless):
#   runs of 3+ '<' / '>'          -> same number of '‹' / '›' (U+2039/U+203A),
#                                    so "<<<END_RESPONSE>>>" cannot be forged
#   "<|" and "|>" (also fullwidth '｜' as in DeepSeek's tokens) -> "<\|", "|\>"
#                                    so "<|im_start|>" becomes "<\|im_start|\>"
#   <s> </s> <think> <bos> <start_of_turn> ... and <<SYS>>  -> '‹...›'
#   [INST] [/INST] [SYS]          -> "[\INST]", "[\/INST]"
# Control characters (except \n and \t) and invisible format characters
# (zero-width spaces, bidi overrides) are removed first, so that "<\u200b<<"
# cannot slip through as "<<<" once a model ignores the invisible character.

_PIPE_OPEN = re.compile(r"<([|｜])")
_PIPE_CLOSE = re.compile(r"([|｜])>")
_ANGLE_TAG = re.compile(
    r"<(/?)(s|think|bos|eos|unk|pad|start_of_turn|end_of_turn|tool_call|tool_response)>",
    re.IGNORECASE,
)
_LLAMA_SYS = re.compile(r"<<(/?SYS)>>", re.IGNORECASE)
_BRACKET_TAG = re.compile(r"\[(/?)(INST|SYS)\]", re.IGNORECASE)
_LT_RUN = re.compile(r"<{3,}")
_GT_RUN = re.compile(r">{3,}")
_TAG_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def _as_str(text: object) -> str:
    if text is None:
        return ""
    return text if isinstance(text, str) else str(text)


def _drop_invisible(text: str, format_chars: bool) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    keep = []
    for ch in text:
        cat = unicodedata.category(ch)
        if (cat == "Cc" and ch not in "\n\t") or (format_chars and cat == "Cf"):
            continue
        keep.append(ch)
    return "".join(keep)


def escape_control_tokens(text: str) -> str:
    """Remove control chars and defuse chat-template control tokens only.

    Used for text a *model under test* reads as its user turn (blue reading
    red's prompt): no data markers there, and invisible format characters are
    kept because obfuscating with them is a legitimate attack to defend.
    """
    text = _drop_invisible(_as_str(text), format_chars=False)
    text = _PIPE_CLOSE.sub(r"\1\\>", _PIPE_OPEN.sub(r"<\\\1", text))
    text = _ANGLE_TAG.sub(lambda m: f"‹{m.group(1)}{m.group(2)}›", text)
    text = _LLAMA_SYS.sub(lambda m: f"‹‹{m.group(1)}››", text)
    return _BRACKET_TAG.sub(lambda m: f"[\\{m.group(1)}{m.group(2)}]", text)


def neutralize(text: str) -> str:
    """Make ``text`` safe to place inside a judge data block (see escapes above)."""
    text = _drop_invisible(_as_str(text), format_chars=True)
    text = escape_control_tokens(text)
    text = _LT_RUN.sub(lambda m: "‹" * len(m.group(0)), text)
    return _GT_RUN.sub(lambda m: "›" * len(m.group(0)), text)


def data_block(tag: str, text: str) -> str:
    """``<<<BEGIN_TAG>>>`` / neutralized text / ``<<<END_TAG>>>``."""
    if not isinstance(tag, str) or not _TAG_NAME.fullmatch(tag):
        raise ValueError(f"data_block tag must be UPPER_SNAKE_CASE, got {tag!r}")
    return f"<<<BEGIN_{tag}>>>\n{neutralize(text)}\n<<<END_{tag}>>>"


# ----------------------------------------------------------------- parsing


@dataclass(frozen=True)
class ParseResult:
    """Exactly one of ``label`` / ``error`` is set; ``error`` is in PARSE_ERRORS."""

    label: str | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.label is not None


# Markdown decorations a judge may put around "Label: x": bold/italic stars,
# backticks, and a leading heading/quote/bullet marker.
_DECOR = re.compile(r"[*`]")
_LEAD = re.compile(r"^\s*(?:#{1,6}\s+|>\s*|[-+•]\s+)*")
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")


def _clean_value(value: str) -> str:
    """The value of a key line, as strict as the spec: markdown, quotes or
    brackets around the label and one final period are allowed, nothing else
    ('**positive**.' -> 'positive', 'positive!' stays 'positive!')."""
    v = _DECOR.sub("", value).strip()
    v = re.sub(r"\.$", "", v).strip()
    return v.strip(" \t_\"'[]()").casefold()


def _clean_bare(text: str) -> str:
    """A whole bare answer without markdown and edge punctuation."""
    return _EDGE_PUNCT.sub("", _DECOR.sub("", text)).strip().casefold()


def _scan(text: str, labels: tuple[str, ...], key: str) -> tuple[list[str], bool, bool]:
    """Return (labels on valid key lines, any key line seen, any multi-label key line)."""
    key_line = re.compile(rf"^{re.escape(key)}\s*[:：]\s*(.*)$", re.IGNORECASE)
    words = re.compile(r"(?<!\w)(" + "|".join(re.escape(x) for x in labels) + r")(?!\w)", re.IGNORECASE)
    by_fold = {x.casefold(): x for x in labels}
    found: list[str] = []
    seen = multi = False
    for line in text.splitlines():
        m = key_line.match(_LEAD.sub("", _DECOR.sub("", line)).strip())
        if m is None:
            continue
        seen = True
        value = m.group(1)
        if _clean_value(value) in by_fold:
            found.append(by_fold[_clean_value(value)])
        elif len({w.casefold() for w in words.findall(value)}) >= 2:
            multi = True  # "Label: negative/positive", "Label: negative or positive"
    return found, seen, multi


def _parse_visible(text: str, labels: tuple[str, ...], key: str) -> ParseResult:
    found, seen, multi = _scan(text, labels, key)
    if multi or len(set(found)) >= 2:
        return ParseResult(None, "multiple_labels")
    if found:
        return ParseResult(found[-1])
    if not seen:  # a bare answer such as "Positive." is accepted only alone
        by_fold = {x.casefold(): x for x in labels}
        if _clean_bare(text) in by_fold:
            return ParseResult(by_fold[_clean_bare(text)])
    return ParseResult(None, "no_label")


def _mentions_label(text: str, labels: tuple[str, ...], key: str) -> bool:
    """Does '{key}: <label>' occur anywhere (thinking is prose, not lines)?"""
    alts = "|".join(re.escape(x) for x in labels)
    pattern = rf"(?<!\w){re.escape(key)}\s*[*`]*\s*[:：]\s*[*`]*\s*({alts})(?!\w)"
    return re.search(pattern, text, re.IGNORECASE) is not None


def parse_label(
    text: str,
    labels: tuple[str, ...] = LABELS,
    key: str = "Label",
    finished: bool = True,
) -> ParseResult:
    """Strictly parse a judge answer ending in ``{key}: <label>``. Never raises.

    ``finished=False`` means the generation hit its token limit: without a
    valid label the error is "truncated" (a cut answer is not a "no_label").
    """
    labels = tuple(str(x) for x in labels)
    text = _as_str(text)
    if not text.strip():
        return ParseResult(None, "empty")
    visible, thinking = strip_thinking(text)
    result = _parse_visible(visible, labels, key)
    if result.ok or result.error == "multiple_labels":
        return result
    if not finished:
        return ParseResult(None, "truncated")
    if thinking and _mentions_label(thinking, labels, key):
        return ParseResult(None, "only_in_thinking")
    return ParseResult(None, "empty" if not visible else "no_label")


def parse_verdict(text: str, choices: tuple[str, ...], finished: bool = True) -> ParseResult:
    """Parse ``Verdict: <choice>`` answers (semantic judge, experts)."""
    return parse_label(text, labels=tuple(choices), key="Verdict", finished=finished)


# --------------------------------------------------------- red's output

_PROMPT_TAG = re.compile(r"<prompt>(.*?)</prompt>", re.IGNORECASE | re.DOTALL)
_PREFIX = re.compile(  # "Prompt:", "**Wrapped prompt:**", "Here is the adversarial prompt:"
    r"^\s*[*`_]*\s*(?:here(?:'s| is)[ \t]+)?(?:[a-z-]+[ \t]+){0,2}prompt\s*[*`_]*\s*[:：]\s*[*`_]*\s*",
    re.IGNORECASE,
)
_QUOTES = [('"', '"'), ("'", "'"), ("“", "”"), ("«", "»"), ("「", "」")]
_FENCE = re.compile(r"^```[\w-]*\n(.*)\n```$", re.DOTALL)


def extract_wrapped_prompt(text: str) -> str | None:
    """Red's wrapped prompt: the last complete <prompt>...</prompt>, else the
    visible text without a "Prompt:"-like prefix and surrounding quotes."""
    visible, _ = strip_thinking(_as_str(text))
    blocks = _PROMPT_TAG.findall(visible)
    if blocks:
        out = blocks[-1].strip()
    else:
        out = re.sub(r"^\s*<prompt>|</prompt>\s*$", "", visible, flags=re.IGNORECASE)
        out = _PREFIX.sub("", out.strip(), count=1)
    out = out.strip()
    m = _FENCE.match(out)
    if m:
        out = m.group(1).strip()
    for left, right in _QUOTES:
        if len(out) >= 2 and out.startswith(left) and out.endswith(right):
            out = out[len(left): -len(right)].strip()
            break
    return out or None
