#!/usr/bin/env python3
"""Writes kjv_cloze.jsonl: a cloze of held-out KJV verses, in the style of LAMBADA.

LAMBADA (Paperno et al. 2016, arXiv 1606.06031) asks for the last word of a passage. Here each
document is a verse of the default corpus's validation split (the last 5% of data/kjv.txt, which
no run trains on: TokenData holds out the last val_fraction of a text corpus) with the verse
before it; the task is to pick the verse's last word among four: the word itself and three
distractors drawn from the words of the training split that have the same length in bytes and
the same case (all lower case, or capitalised). Equal lengths keep acc and acc_norm honest (no
choice is favoured for being short), equal case gives no choice away by its first letter, and a
model that knows nothing scores exactly the chance level, 1/4.

Only the standard library; the same corpus and seed give the same bytes:

  python3 experiments/small/tasks/make_kjv_cloze.py --out experiments/small/tasks/kjv_cloze.jsonl

(--corpus defaults to the repository's data/kjv.txt, which `make data` writes.)

The task file beside it, kjv_cloze.yaml, reads the output in lm-evaluation-harness's format
(docs/evals.md).
"""
import argparse
import json
import os
import random
import re
import sys

# TokenData's hold-out of a text corpus (train.data.val_fraction's default).
VAL_FRACTION = 0.05
# A verse: its reference, then its text ("Rev22:21 The grace of our Lord ... Amen.").
VERSE = re.compile(r"^(\S+ )(.*\S)\s*$")
# The last word: letters, then what follows it (punctuation) up to the end of the line.
LAST_WORD = re.compile(r"^(.*\s)([A-Za-z]+)([^A-Za-z]*)$")


def shape(word):
    """What a distractor must share with the answer: its length and its case."""
    case = "lower" if word.islower() else "title" if word.istitle() else "other"
    return (len(word), case)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.realpath(__file__))
    parser.add_argument("--corpus", default=os.path.join(here, "..", "..", "..", "data", "kjv.txt"),
                        help="the default corpus (default: the repository's data/kjv.txt)")
    parser.add_argument("--out", required=True, help="the JSON Lines file to write")
    parser.add_argument("--items", type=int, default=200, help="documents (default 200)")
    parser.add_argument("--min-letters", type=int, default=4,
                        help="the shortest answer, in letters (default 4: content words)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with open(args.corpus, "rb") as f:
        corpus = f.read()
    cut = len(corpus) - int(len(corpus) * VAL_FRACTION)
    train_words = {}
    for word in re.findall(rb"[A-Za-z]+", corpus[:cut]):
        word = word.decode("ascii")
        train_words.setdefault(shape(word), set()).add(word)
    by_shape = {key: sorted(words) for key, words in train_words.items() if key[1] != "other"}

    # Whole lines that start inside the validation split.
    start = corpus.find(b"\n", cut) + 1
    lines = corpus[start:].decode("utf-8").split("\n")
    candidates = []
    for previous, line in zip(lines, lines[1:]):
        verse = VERSE.match(line)
        if not verse or not VERSE.match(previous):
            continue
        last = LAST_WORD.match(line)
        if not last or len(last.group(2)) < args.min_letters:
            continue
        word = last.group(2)
        if len(by_shape.get(shape(word), [])) < 4:
            continue
        candidates.append((previous + "\n" + last.group(1).rstrip(" "), word))
    if len(candidates) < args.items:
        sys.exit(f"make_kjv_cloze: {len(candidates)} verses qualify, fewer than --items {args.items}")

    rng = random.Random(args.seed)
    chosen = sorted(rng.sample(range(len(candidates)), args.items))
    with open(args.out, "w", encoding="utf-8") as out:
        for i in chosen:
            context, word = candidates[i]
            pool = [w for w in by_shape[shape(word)] if w.lower() != word.lower()]
            choices = rng.sample(pool, 3) + [word]
            rng.shuffle(choices)
            out.write(json.dumps({"context": context, "choices": choices,
                                  "label": choices.index(word)}) + "\n")
    print(f"make_kjv_cloze: wrote {args.items} documents of {len(candidates)} qualifying verses "
          f"to {args.out}")


if __name__ == "__main__":
    main()
