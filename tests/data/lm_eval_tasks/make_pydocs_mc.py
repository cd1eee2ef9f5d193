"""Writes pydocs_mc.jsonl: multiple-choice questions on Python facts (hand-written; answers checked below).

Kept as a script so the items stay reviewable; the JSONL is committed and the tests only read it.
Run from anywhere: `python tests/data/lm_eval_tasks/make_pydocs_mc.py`.
"""

import json
import pathlib

# (question, correct answer, three wrong answers). The correct answer's position is rotated when written.
ITEMS = [
    ("Which built-in function returns the number of items in a container?", "len", "size", "count", "length"),
    ("Which built-in function returns the absolute value of a number?", "abs", "fabs", "absolute", "magnitude"),
    ("Which keyword defines a function?", "def", "func", "function", "lambda"),
    ("Which keyword defines a class?", "class", "struct", "type", "object"),
    ("Which keyword leaves the innermost loop?", "break", "exit", "continue", "stop"),
    ("Which keyword skips to the next iteration of a loop?", "continue", "next", "pass", "skip"),
    ("Which statement does nothing?", "pass", "noop", "skip", "null"),
    ("Which keyword makes a function a generator?", "yield", "return", "async", "await"),
    ("Which keyword handles an exception in a try statement?", "except", "catch", "rescue", "handle"),
    ("Which keyword raises an exception?", "raise", "throw", "signal", "error"),
    ("Which built-in type is immutable: a list, a dict, a set or a tuple?", "tuple", "list", "dict", "set"),
    ("What does the expression 7 // 2 evaluate to?", "3", "3.5", "4", "1"),
    ("What does the expression 7 % 3 evaluate to?", "1", "2", "0", "3"),
    ("What does the expression 2 ** 3 evaluate to?", "8", "6", "9", "5"),
    ("What does len('abc') return?", "3", "2", "4", "0"),
    ("Which string method returns a copy in upper case?", "upper", "capitalize", "title", "swapcase"),
    ("Which string method splits a string into a list of words?", "split", "join", "partition", "strip"),
    ("Which string method joins an iterable of strings?", "join", "concat", "merge", "append"),
    ("Which list method adds one item to the end of a list?", "append", "extend", "insert", "add"),
    ("Which list method removes and returns the last item?", "pop", "remove", "clear", "discard"),
    ("Which dict method returns a value or a default for a missing key?", "get", "pop", "setdefault", "items"),
    ("Which set method adds an element to a set?", "add", "append", "insert", "push"),
    ("Which module provides regular expressions?", "re", "regex", "string", "glob"),
    ("Which module provides mathematical functions such as sqrt?", "math", "cmath", "numbers", "decimal"),
    ("Which module parses command line arguments?", "argparse", "getpass", "shlex", "optparse"),
    ("Which module serializes objects to JSON text?", "json", "pickle", "marshal", "shelve"),
    ("Which module provides pseudo-random numbers?", "random", "secrets", "hashlib", "uuid"),
    ("Which module works with dates and times?", "datetime", "calendar", "locale", "zoneinfo"),
    ("Which module copies and removes directory trees?", "shutil", "os", "pathlib", "tempfile"),
    ("Which module runs and connects to subprocesses?", "subprocess", "threading", "signal", "socket"),
    ("Which module provides object-oriented file system paths?", "pathlib", "os.path", "glob", "fnmatch"),
    ("Which module provides deque and Counter?", "collections", "itertools", "functools", "heapq"),
    ("Which module provides lru_cache and partial?", "functools", "itertools", "operator", "contextlib"),
    ("Which module provides a heap queue?", "heapq", "queue", "bisect", "array"),
    ("Which module keeps a list sorted by bisection?", "bisect", "heapq", "sort", "array"),
    ("Which module writes log messages?", "logging", "warnings", "syslog", "traceback"),
    ("Which module runs unit tests?", "unittest", "doctest", "pdb", "timeit"),
    ("Which module measures the execution time of small code snippets?", "timeit", "time", "profile", "sched"),
    ("Which built-in function returns an iterator of index and item pairs?", "enumerate", "zip", "range", "iter"),
    ("Which built-in function pairs up items of several iterables?", "zip", "map", "enumerate", "filter"),
    ("Which built-in function returns a new sorted list?", "sorted", "sort", "order", "reversed"),
    ("Which built-in function tells whether an object is an instance of a class?", "isinstance", "type", "issubclass", "callable"),
    ("Which built-in function opens a file?", "open", "file", "read", "load"),
    ("Which built-in function converts a string to an integer?", "int", "str", "float", "ord"),
    ("Which built-in function returns the Unicode code point of a character?", "ord", "chr", "hex", "ascii"),
    ("Which value does a function return when it has no return statement?", "None", "0", "False", "an empty tuple"),
    ("Which exception does a missing dictionary key raise?", "KeyError", "IndexError", "ValueError", "LookupError"),
    ("Which exception does an index past the end of a list raise?", "IndexError", "KeyError", "StopIteration", "ValueError"),
]


def main() -> None:
    out = pathlib.Path(__file__).with_name("pydocs_mc.jsonl")
    with out.open("w") as f:
        for i, (question, correct, *wrong) in enumerate(ITEMS):
            answer = i % 4
            choices = list(wrong)
            choices.insert(answer, correct)
            assert len(set(choices)) == 4, question
            f.write(json.dumps({"question": question, "choices": choices, "answer": answer}) + "\n")
    print(f"wrote {len(ITEMS)} items to {out}")


if __name__ == "__main__":
    main()
