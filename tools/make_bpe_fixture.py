#!/usr/bin/python3
"""tools/make_bpe_fixture.py — writes tests/golden/bpe/: a small GPT-2-style byte-level BPE
trained with Hugging Face `tokenizers` on Debian's fortunes, and the ids `tokenizers` gives a
set of texts, so that tests/data/bpe_tokenizer_test.cpp checks data::BpeTokenizer against it
without Python.

Run with a Python that has `tokenizers` (nothing else is needed), fortunes installed
(apt-get install -y fortunes):

    /work/main/.bench-venv/bin/python tools/make_bpe_fixture.py

Writes vocab.json and merges.txt (GPT-2's formats: token -> id; "#version: 0.2", then one merge
"left right" a line, by rank) and cases.json (each text with its ids). The ids come from a
tokenizer loaded back from the two files, as GPT-2's is, with <|endoftext|> a special token;
they are checked to equal the trained tokenizer's, and decoding them to give the text back.
"""
import hashlib
import json
import os
import sys

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT_DIR = os.path.join(ROOT, "tests", "golden", "bpe")
CORPUS = "/usr/share/games/fortunes"
VOCAB_SIZE = 1000
EOT = "<|endoftext|>"


def corpus_files(root):
    """Every regular file below root, sorted by path, without the .dat indexes, the .u8 links
    and any symlink: what data/text.cpp's read_corpus reads, in its order (std::filesystem
    compares paths element by element, as tuples of parts do here)."""
    files = []
    for folder, _, names in os.walk(root, followlinks=False):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            if os.path.splitext(name)[1] in (".dat", ".u8"):
                continue
            files.append(path)
    return sorted(files, key=lambda p: os.path.relpath(p, root).split(os.sep))


def gpt2_style(model):
    """A tokenizer as GPT-2's: no normalizer, the ByteLevel pre-tokenizer with GPT-2's regex and
    no prefix space, the ByteLevel decoder, <|endoftext|> a special token."""
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def train(texts):
    tok = gpt2_style(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def chunk(text, start, size):
    """About `size` bytes of text from `start`, whole lines (so whole characters)."""
    begin = text.index("\n", start) + 1
    end = text.index("\n", begin + size) + 1
    return text[begin:end]


def cases(corpus_text):
    return [
        ("hello", "Hello, world!"),
        ("pangram", "The quick brown fox jumps over the lazy dog."),
        ("sentence", "A fortune is a short saying; most of them are meant to be funny."),
        ("contractions", "It's what they're saying: we'll see. I've, I'm, you'd, don't."),
        ("contractions_upper", "IT'S WHAT THEY'RE SAYING: WE'LL SEE. I'VE, I'M, DON'T."),
        ("contractions_edges", "'s't 're've 'm'll'd ''s 'S 'Re rock'n'roll O'Neil's dogs'"),
        ("space_runs", "a  b   c    d     e"),
        ("leading_spaces", "   three leading spaces"),
        ("trailing_spaces", "trailing spaces   "),
        ("only_spaces", "      "),
        ("tabs", "a\tb\t\tc \td\t"),
        ("newlines", "line one\nline two\n\nline four\n"),
        ("crlf", "dos\r\nline endings\r\n\r\n"),
        ("mixed_whitespace", "x \t\n y\n\n\n  z \n"),
        ("trailing_newlines", "the end\n\n\n"),
        ("digits", "1234567890 3.14159 1,000,000 2024-01-01 007"),
        ("digits_letters", "abc123def 4u2 H2O x86_64 v1.2.3"),
        ("punctuation", "Wait... what?! (yes) [no] {maybe} <tag> #hash @user $5 100% a&b"),
        ("symbols", "*star* ~tilde~ ^caret^ `tick` |pipe| \\back\\ /slash/ ==> <== --- ;;"),
        ("code", "int main(void) {\n    return a[i] != 0 ? x->y : -1;\n}\n"),
        ("url", "see https://example.com/path?q=1&r=2 or mail first.last@example.org"),
        ("latin_accents", "café naïve résumé Ångström"),
        ("eszett", "Straße Fußgänger groß ẞ"),
        ("greek", "Ελληνικά: η γλώσσα μου"),
        ("japanese", "日本語のテキスト、漢字とかな。"),
        ("cyrillic", "Привет, мир! Съешь же ещё этих мягких французских булок."),
        ("arabic_hebrew", "مرحبا بالعالم שלום עולם"),
        ("emoji", "I \u2764\ufe0f emoji \U0001F600\U0001F44D\U0001F3FD \U0001F1EB\U0001F1F7 "
                  "\U0001F468\u200d\U0001F469\u200d\U0001F467!"),
        ("combining_marks", "e\u0301 n\u0303o a\u0308\u0304 Z\u0351\u0352\u0353algo"),
        ("unicode_spaces", "a\u00a0b\u3000c\u2003d x\u0085y p\u2028q\u2029 \u00a0 end"),
        ("unicode_digits", "\u0663\u0664\u0665 \u00bd \u216b x\u00b2 \uff11\uff12"),
        ("control_chars", "\x00nul \x01\x1f\x7f del\x07bell\x0b\x0c"),
        ("eot_between", f"first document{EOT}second document"),
        ("eot_spaced", f"the end. {EOT} The beginning\n{EOT}\n"),
        ("eot_edges", f"{EOT}{EOT}x{EOT}"),
        ("eot_partial", "<|endoftext| <|endof <|ENDOFTEXT|> <||>"),
        ("empty", ""),
        ("one_letter", "a"),
        ("one_space", " "),
        ("one_newline", "\n"),
        ("long_words", "supercalifragilisticexpialidocious antidisestablishmentarianism"),
        ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaaa ----------------------------------------"),
        ("corpus_start", chunk(corpus_text, 0, 2000)),
        ("corpus_middle", chunk(corpus_text, len(corpus_text) // 2, 2000)),
    ]


def sha256(path):  # of a file
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    if not os.path.isdir(CORPUS):
        sys.exit(f"make_bpe_fixture: {CORPUS} is missing; apt-get install -y fortunes")
    texts = [open(p, encoding="utf-8").read() for p in corpus_files(CORPUS)]
    trained = train(texts)
    os.makedirs(OUT_DIR, exist_ok=True)
    trained.model.save(OUT_DIR)  # vocab.json, merges.txt
    vocab_path = os.path.join(OUT_DIR, "vocab.json")
    merges_path = os.path.join(OUT_DIR, "merges.txt")

    loaded = gpt2_style(models.BPE.from_file(vocab_path, merges_path))
    loaded.add_special_tokens([EOT])
    eot_id = loaded.token_to_id(EOT)
    assert eot_id == trained.token_to_id(EOT)

    corpus_text = "".join(texts)
    corpus_ids = loaded.encode(corpus_text).ids
    assert corpus_ids == trained.encode(corpus_text).ids
    assert loaded.decode(corpus_ids, skip_special_tokens=False) == corpus_text

    rows = []
    for name, text in cases(corpus_text):
        ids = loaded.encode(text).ids
        assert ids == trained.encode(text).ids, name
        assert loaded.decode(ids, skip_special_tokens=False) == text, name
        rows.append(json.dumps({"name": name, "text": text, "ids": ids}, ensure_ascii=False))

    header = {
        "tokenizers": tokenizers.__version__,
        "vocab_size": loaded.get_vocab_size(),
        "eot_id": eot_id,
        "sha256": {"vocab.json": sha256(vocab_path), "merges.txt": sha256(merges_path)},
        # The whole corpus's ids, too many to keep: their count and the SHA-256 of their decimal
        # digits joined by commas, for the corpus whose bytes have this SHA-256.
        "corpus": {
            "bytes": len(corpus_text.encode("utf-8")),
            "sha256": hashlib.sha256(corpus_text.encode("utf-8")).hexdigest(),
            "tokens": len(corpus_ids),
            "ids_sha256": hashlib.sha256(",".join(map(str, corpus_ids)).encode()).hexdigest(),
        },
    }
    with open(os.path.join(OUT_DIR, "cases.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(header, ensure_ascii=False)[:-1])
        f.write(', "cases": [\n' + ",\n".join(rows) + "\n]}\n")
    print(f"wrote {os.path.normpath(OUT_DIR)}: vocab {header['vocab_size']}, {len(rows)} cases, "
          f"tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
