"""From the model's CTC logits back to text: greedy decoding over CHARSET, then letters read
for old-style digits inside numbers turned back into digits, zeros inside words into O and
the spaces a monospaced font's wide cells were read as taken out of prices and brackets.

The model's alphabet and its decoding belong together (training decodes with `ctc_greedy` to
measure itself); the handler's postprocess only joins what these give per line.
"""

from __future__ import annotations

import re

import numpy as np

CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;-/()'\"!?&%#@+=$"


LOOKALIKES = str.maketrans("oOIlgz", "001192")
NUMBER = re.compile(r"[0-9oOIlgz.,:/\-%$#()+=]*[0-9][0-9oOIlgz.,:/\-%$#()+=]*")
UNIT = re.compile(r"[0-9.,]+(oz|[glz])\W*")  # 500g, 1l, 16oz: the letters are letters


# The space the model reads in a monospaced font's wide cells: after a price's full stop,
# inside brackets ('174. 40', '( 206)'). Not after a colon: 'Item 3: 25.00' has its own.
SPACES_IN_NUMBERS = re.compile(r"(?<=\d\.) (?=\d\d(?:\D|$))|(?<=\() | (?=\))")
ZERO_IN_WORD = re.compile(r"[\W_]*[A-Za-z0]*[A-Za-z][A-Za-z0]*[\W_]*")  # '(J0HNSON', 'BR0WN:'


def corrected(text: str) -> str:
    """A line's text after the rules that put back what a font's design made the model read
    otherwise: digits in numbers, letters in words, no spaces inside a price or brackets."""
    text = digits_in_numbers(SPACES_IN_NUMBERS.sub("", text))
    return " ".join(letters_in_words(word) for word in text.split(" "))


def letters_in_words(word: str) -> str:
    """A slashed or dotted zero read inside a word of letters turned back into an O ('o' unless
    the word is in capitals: 'J0hn' is 'John'): monospaced fonts draw the O as narrow as their
    zero ('J0HNSON MARKET', 'SUBT0TAL', 'BR0WN:' on documents.py's receipts). Words with other
    digits keep them ('A10')."""
    if "0" not in word or not ZERO_IN_WORD.fullmatch(word):
        return word
    return word.replace("0", "O" if word.replace("0", "").isupper() else "o")


def digits_in_numbers(text: str) -> str:
    """Letters read for digits inside numbers turned back into digits: 'o' and 'O' for 0, 'I'
    and 'l' for 1, 'g' for 9, 'z' for 2, in a word of digits, those letters and the signs of
    numbers where digits are at least as many as the letters, and not a unit (500g, 16oz).

    Old-style figures (the 0 as high as an o, the 1 as an I, the 9 below the line as a g)
    were read as those letters: '1997-o6-16 2O19', 'Qty 88 x 8g8.24' (stress.py: CER 2.0 %,
    0.3 % now; evaluate.py --fonts on the 7 unseen families of stress.py: line CER 1.85 %
    -> 1.38 %)."""
    words = text.split(" ")
    for i, word in enumerate(words):
        if NUMBER.fullmatch(word) and not UNIT.fullmatch(word):
            digits = sum(c.isdigit() for c in word)
            if digits >= sum(c in "oOIlgz" for c in word):
                words[i] = word.translate(LOOKALIKES)
    return " ".join(words)


def ctc_greedy(logits: np.ndarray) -> tuple[str, list[float]]:
    """Best class per frame, repeats merged, blanks dropped; each char's peak probability."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    best = probs.argmax(axis=1)
    chars: list[str] = []
    peaks: list[float] = []
    for t, cls in enumerate(best.tolist()):
        p = float(probs[t, cls])
        if cls != 0 and t > 0 and cls == best[t - 1]:
            peaks[-1] = max(peaks[-1], p)
        elif cls != 0:
            chars.append(CHARSET[cls - 1])
            peaks.append(p)
    return "".join(chars).strip(), peaks
