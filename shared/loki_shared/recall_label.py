"""The label of an archived block, built by the chat service before archiving.

Rule (recall issue): the role — or the tool's name for a tool result — then ``": "``, then
the first non-blank line of the content with surrounding white space trimmed, cut to 70
characters (Unicode code points) followed by ``…`` when longer. When the content has no
non-blank line the label is the bare role (or tool name).

"White space" and "blank" follow Go's ``unicode.IsSpace`` (the original system's rule), which
differs from Python's ``str.isspace`` on U+001C–U+001F (not space for Go).
"""

from __future__ import annotations

#: Go's unicode.IsSpace set: ASCII \t \n \v \f \r and space, U+0085, U+00A0, and the
#: Unicode White_Space characters outside Latin-1.
GO_SPACE = (
    "\t\n\v\f\r \u0085\u00a0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)

LABEL_MAX = 70
ELLIPSIS = "\u2026"


def go_trim(text: str) -> str:
    """``text`` without leading and trailing white space, as Go's ``strings.TrimSpace``."""
    return text.strip(GO_SPACE)


def recall_label(role: str, content: str, tool_name: str | None = None) -> str:
    """Label of a block: ``"<who>: <first non-blank line>"`` or the bare ``<who>``.

    ``who`` is ``tool_name`` when given and non-empty (a tool result), else ``role``. Lines are
    split on ``"\\n"``; a line is blank when only white space remains after trimming. The
    trimmed line is cut to 70 code points plus ``…`` when longer.
    """
    who = tool_name if tool_name else role
    for line in content.split("\n"):
        trimmed = go_trim(line)
        if trimmed:
            if len(trimmed) > LABEL_MAX:
                trimmed = trimmed[:LABEL_MAX] + ELLIPSIS
            return f"{who}: {trimmed}"
    return who
