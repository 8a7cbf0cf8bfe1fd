"""People's names, as plangate compares them: one person, one name.

``Alice``, ``alice `` and ``ＡＬＩＣＥ`` are the same person: a name is compared in its
canonical form (Unicode NFKC, case-folded, white space around it stripped). A name that
mixes scripts (a Cyrillic ``а`` among Latin letters) is refused when an account is made,
and a name that only looks like another (``аlісе`` written in Cyrillic, ``al1ce``) is
refused while the other exists; wherever two names are compared for the four-eyes rule,
look-alikes count as the same person.
"""

from __future__ import annotations

import unicodedata

from plangate.errors import UsageError

MAX_LENGTH = 64
_PUNCTUATION = frozenset("-_.@")
# Letters of other scripts that read as Latin ones, and digits that read as letters (after
# UTS #39's confusables, the ones that matter in names).
_LOOK_ALIKES = str.maketrans(
    {
        **dict(zip("аеорсухіјѕԁһӏԛԝкмтвпн", "aeopcyxijsdhlqwkmtbnh", strict=True)),  # Cyrillic
        **dict(zip("αοριντκχυεϲ", "aopivtkxuec", strict=True)),  # Greek
        **dict(zip("ıɑɡℓƖɩʟ", "iaglili", strict=True)),  # Latin letters that pass for others
        **dict(zip("հսցօոռզքաԁ", "hugonnqpwd", strict=True)),  # Armenian
        "0": "o",
        "1": "l",
        "|": "l",
    }
)
_LOOK_ALIKE_PAIRS = (("rn", "m"), ("vv", "w"), ("cl", "d"))
_ONE_SCRIPT = {"HIRAGANA": "CJK", "KATAKANA": "CJK", "CJK": "CJK", "HANGUL": "CJK"}


def canonical(name: str) -> str:
    """The form in which names are stored and compared: NFKC, case-folded, stripped."""
    return unicodedata.normalize("NFKC", name).casefold().strip()


def skeleton(name: str) -> str:
    """What a name looks like: two names with one skeleton are one person to a reader.

    Characters that show nothing (format characters such as a soft hyphen or a zero-width
    joiner) are dropped, look-alike letters and digits mapped to the letter they pass for.
    """
    shown = "".join(c for c in canonical(name) if unicodedata.category(c) != "Cf").translate(_LOOK_ALIKES)
    for pair, letter in _LOOK_ALIKE_PAIRS:
        shown = shown.replace(pair, letter)
    return shown


def same_person(a: str, b: str) -> bool:
    return skeleton(a) == skeleton(b)


def new_name(name: str) -> str:
    """``name`` in canonical form, refused with a plain reason if it cannot be an account's name."""
    text = canonical(name)
    if not text:
        raise UsageError("a user name cannot be empty")
    if len(text) > MAX_LENGTH:
        raise UsageError(f"a user name has at most {MAX_LENGTH} characters")
    for char in text:
        if not (char.isalnum() or char in _PUNCTUATION):
            raise UsageError(f"a user name is letters, digits, '-', '_', '.' and '@', not {char!r}")
    scripts = sorted({_script(c) for c in text if c.isalpha()})
    if len(scripts) > 1:
        raise UsageError(
            f"the user name {text!r} mixes scripts ({', '.join(scripts)}): a name that mixes scripts can pass"
            " for another person's"
        )
    return text


def _script(char: str) -> str:
    first = unicodedata.name(char, "UNKNOWN").split(" ")[0]
    return _ONE_SCRIPT.get(first, first)
