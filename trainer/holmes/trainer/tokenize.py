"""Offline text -> token file tool.

    python -m holmes.trainer.tokenize --out tokens.bin a.txt b.txt ...
    python -m holmes.trainer.tokenize --out tokens.bin --tokenizer tokenizer.json docs/*.txt

Default: a byte-level tokenizer (ids 0-255 are the UTF-8 bytes, 256 ends a document), so
vocabSize >= 257 and nothing is downloaded. With ``--tokenizer`` a Hugging Face ``tokenizer.json``
the user supplies is used (the ``tokenizers`` package): each document is encoded without the
tokenizer's own special tokens and followed by its end-of-sequence id, which is ``--eos-token``,
else the ``eos_token`` of a ``tokenizer_config.json`` beside it, else the one of ``</s>``,
``<|endoftext|>``, ``<|end_of_text|>``, ``<eos>`` the vocabulary has. Writes the flat token file
plus a sidecar ``<out>.json`` with dtype, vocabulary size and that id, which the trainer reads.
"""

from __future__ import annotations

import argparse
import json
import os
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


EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")


class TokenizerError(ValueError):
    pass


def _configured_eos(path: str) -> str | None:
    """eos_token of the tokenizer_config.json beside tokenizer.json, when there is one."""
    conf = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
    if not os.path.isfile(conf):
        return None
    with open(conf) as f:
        eos = json.load(f).get("eos_token")
    return eos.get("content") if isinstance(eos, dict) else eos


def end_of_document(tok, path: str, name: str | None) -> int:
    """The id that separates documents (see the module docstring for where it comes from)."""
    candidates = [name] if name else [n for n in (_configured_eos(path),) if n] or list(EOS_NAMES)
    for candidate in candidates:
        found = tok.token_to_id(candidate)
        if found is not None:
            return found
    if name or candidates != list(EOS_NAMES):
        raise TokenizerError(f"{path}: the vocabulary has no token {candidates[0]!r}; check --eos-token")
    raise TokenizerError(
        f"{path}: cannot tell which token ends a document (no tokenizer_config.json eos_token, none of "
        f"{', '.join(EOS_NAMES)} in the vocabulary); pass --eos-token"
    )


def hf_encoder(path: str, eos_token: str | None = None) -> tuple[Callable[[str], list[int]], int, int]:
    """(encode, vocabulary size, end-of-document id) for a tokenizer.json."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("--tokenizer needs the `tokenizers` package: pip install tokenizers") from None
    tok = Tokenizer.from_file(path)
    eos = end_of_document(tok, path, eos_token)
    return (lambda text: tok.encode(text, add_special_tokens=False).ids + [eos]), tok.get_vocab_size(), eos


def write_token_file(
    out: str,
    texts: Iterable[str],
    encode: Callable[[str], list[int]] = byte_encode,
    vocab_size: int = BYTE_VOCAB,
    tokenizer: str = "bytes",
    eos: int = END_OF_DOCUMENT,
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
        meta = {"dtype": dtype, "vocabSize": vocab_size, "tokens": count, "tokenizer": tokenizer, "eos": eos}
        json.dump(meta, f)
    return count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m holmes.trainer.tokenize",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True, help="token file to write")
    ap.add_argument("--tokenizer", help="a tokenizer.json to use instead of bytes")
    ap.add_argument("--eos-token", help="the token that ends each document (with --tokenizer)")
    ap.add_argument("inputs", nargs="+", help="text files, one document each ('-' reads stdin)")
    a = ap.parse_args(argv)
    encode: Callable[[str], list[int]] = byte_encode
    vocab, name, eos = BYTE_VOCAB, "bytes", END_OF_DOCUMENT
    if a.eos_token and not a.tokenizer:
        ap.error("--eos-token needs --tokenizer (bytes end each document with 256)")
    if a.tokenizer:
        try:
            encode, vocab, eos = hf_encoder(a.tokenizer, a.eos_token)
        except (OSError, ValueError) as e:
            print(f"holmes.trainer.tokenize: {e}", file=sys.stderr)
            return 2
        name = a.tokenizer

    def texts():
        for p in a.inputs:
            if p == "-":
                yield sys.stdin.read()
            else:
                with open(p, encoding="utf-8", errors="replace") as f:
                    yield f.read()

    n = write_token_file(a.out, texts(), encode, vocab, name, eos)
    print(json.dumps({"out": a.out, "tokens": n, "vocabSize": vocab, "tokenizer": name, "eos": eos}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
