"""Offline text -> token file tool.

    python -m holmes.trainer.tokenize --out tokens.bin a.txt b.txt ...
    python -m holmes.trainer.tokenize --out tokens.bin --tokenizer tokenizer.json docs/*.txt

Default: a byte-level tokenizer (ids 0-255 are the UTF-8 bytes, 256 ends a document), so
vocabSize >= 257 and nothing is downloaded. With ``--tokenizer`` a Hugging Face ``tokenizer.json``
the user supplies is used (needs the ``tokenizers`` package). Writes the flat token file plus a
sidecar ``<out>.json`` with dtype and vocabulary size, which the trainer reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable

import numpy as np

BYTE_VOCAB = 257
END_OF_DOCUMENT = 256


def sidecar_path(path: str) -> str:
    """Where the token file's dtype and vocabulary size are kept (the trainer reads it)."""
    return path + ".json"


def byte_encode(text: str) -> list[int]:
    return list(text.encode("utf-8")) + [END_OF_DOCUMENT]


def byte_decode(ids: Iterable[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def _hf_encoder(path: str) -> tuple[Callable[[str], list[int]], int]:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("--tokenizer needs the `tokenizers` package: pip install tokenizers") from None
    tok = Tokenizer.from_file(path)
    return (lambda text: tok.encode(text).ids), tok.get_vocab_size()


def write_token_file(
    out: str,
    texts: Iterable[str],
    encode: Callable[[str], list[int]] = byte_encode,
    vocab_size: int = BYTE_VOCAB,
    tokenizer: str = "bytes",
) -> int:
    """Encode each text as one document and write the flat file + sidecar; returns the token count."""
    dtype = "uint16" if vocab_size <= 65536 else "uint32"
    count = 0
    with open(out, "wb") as f:
        for text in texts:
            ids = np.asarray(encode(text), dtype=dtype)
            ids.tofile(f)
            count += len(ids)
    with open(sidecar_path(out), "w") as f:
        json.dump({"dtype": dtype, "vocabSize": vocab_size, "tokens": count, "tokenizer": tokenizer}, f)
    return count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m holmes.trainer.tokenize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="token file to write")
    ap.add_argument("--tokenizer", help="a tokenizer.json to use instead of bytes")
    ap.add_argument("inputs", nargs="+", help="text files, one document each ('-' reads stdin)")
    a = ap.parse_args(argv)
    encode, vocab, name = byte_encode, BYTE_VOCAB, "bytes"
    if a.tokenizer:
        encode, vocab = _hf_encoder(a.tokenizer)
        name = a.tokenizer

    def texts():
        for p in a.inputs:
            if p == "-":
                yield sys.stdin.read()
            else:
                with open(p, encoding="utf-8", errors="replace") as f:
                    yield f.read()

    n = write_token_file(a.out, texts(), encode, vocab, name)
    print(json.dumps({"out": a.out, "tokens": n, "vocabSize": vocab, "tokenizer": name}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
