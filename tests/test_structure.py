"""`data_prep build --structure`: each level records what a full build records up to that level and nothing
beyond, `verify` accepts it, and the samplers refuse a dataset that lacks what their objective needs."""
import numpy as np
import pytest
from helpers import quick_build

from data_prep import PrepError
from data_prep.dataset import Corpus
from data_prep.encode import doc_hash
from data_prep.text import STRUCTURES, TextOptions, has, normalize
from data_prep.tokenizer import load_tokenizer
from data_prep.verify import verify
from pretrain.data.bert import BertDataset
from pretrain.data.multitask import ErnieDataset
from pretrain.data.gpt import GPTDataset
from pretrain.data.masking import Masker

LEVEL = {"sentence_starts": "sentences", "word_start": "words", "phrase_spans": "full", "entity_spans": "full"}


@pytest.fixture(scope="module")
def builds(small, sp_model, train_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("structure")
    out = {"full": train_data}
    for level in ("none", "sentences", "words"):
        quick_build([small["path"]], root / level, tokenizer=sp_model, text=TextOptions(structure=level))
        out[level] = str(root / level)
    return out


@pytest.mark.parametrize("level", STRUCTURES[:-1])
def test_a_level_records_the_full_builds_structure_up_to_it_and_nothing_beyond(builds, small, sp_model, level):
    full, c = Corpus(builds["full"]), Corpus(builds[level])
    assert c.structure == level and full.structure == "full" and verify(builds[level]) == []
    assert len(c) == len(full) and any(len(full.phrase_spans(i)) for i in range(len(full)))
    for col, needs in LEVEL.items():
        for i in range(len(c)):
            got = getattr(c, col)(i)
            assert np.array_equal(got, getattr(full, col)(i)) if has(level, needs) else got.size == 0, (col, i)
    if level == "none":  # each document tokenized whole
        texts, seen = [], set()
        for t in (normalize(d, TextOptions()) for d in small["docs"]):
            if t and doc_hash(t) not in seen:
                seen.add(doc_hash(t))
                texts.append(t)
        tok = load_tokenizer(sp_model)
        assert len(texts) == len(c)
        assert all(np.array_equal(c.tokens(i), tok.encode([t], offsets=False)[0]) for i, t in enumerate(texts))
    else:
        assert all(np.array_equal(c.tokens(i), full.tokens(i)) for i in range(len(c)))


def test_samplers_refuse_a_dataset_without_the_structure_they_need(builds):
    c = Corpus(builds["full"])

    def masker(strategy):
        return Masker(c.special_ids, c.vocab_size, strategy=strategy)

    assert len(BertDataset(builds["sentences"], 64, masker("token")).sample(0, 0)["labels"]) == 64
    assert len(GPTDataset(builds["none"], 32, seed=1).sample(0, 0)["input_ids"]) == 32
    refused = [
        (lambda: BertDataset(builds["sentences"], 64, masker("whole_word")),
         (r"built with --structure sentences, without the words that whole_word masking needs; rebuild it with "
          r"`data_prep build --structure words`")),
        (lambda: BertDataset(builds["sentences"], 64, masker("token"), pair_task="sop"),
         "without the words that sentence-order prediction needs"),
        (lambda: BertDataset(builds["none"], 64, masker("token")), "without the sentences that token masking needs"),
        (lambda: BertDataset(builds["words"], 64, masker("knowledge")), "without the full that knowledge masking"),
        (lambda: ErnieDataset(builds["words"], 64, masker("knowledge"), tasks={"knowledge_masking": 1.0}),
         "without the full that ERNIE's knowledge masking stages need"),
    ]
    for make, message in refused:
        with pytest.raises(ValueError, match=message):
            make()


def test_build_refuses_options_that_need_more_structure(small, sp_model, tmp_path):
    entities = tmp_path / "entities.txt"
    entities.write_text("New York\n")
    with pytest.raises(PrepError, match="--entities records entity spans, which only --structure full keeps"):
        quick_build([small["path"]], tmp_path / "a", tokenizer=sp_model, entities=str(entities),
                    text=TextOptions(structure="words"))
    with pytest.raises(PrepError, match="--pair-field needs sentences"):
        quick_build([small["path"]], tmp_path / "b", tokenizer=sp_model, pair_field="title",
                    text=TextOptions(structure="none"))


def test_verify_checks_the_columns_against_the_recorded_structure(builds, tmp_path):
    import json
    import shutil

    for built, claimed, problem in (("words", "sentences", "word_start is filled, but the manifest says --structure "
                                     "sentences"), ("sentences", "words", "word_start length differs from input_ids")):
        copy = tmp_path / built
        shutil.copytree(builds[built], copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest["options"]["text"]["structure"] = claimed
        (copy / "manifest.json").write_text(json.dumps(manifest))
        assert any(problem in p for p in verify(str(copy))), verify(str(copy))


def test_training_refuses_such_a_dataset_before_building_the_model(builds, tmp_path, monkeypatch):
    """`ptm train` on a dataset without the structure its objective needs stops with the sampler's line before the
    model is built and DeepSpeed starts (the sources are built first)."""
    from pretrain import models
    from pretrain.config import ConfigError, load
    from pretrain.train import Trainer

    built = []
    monkeypatch.setattr(models, "build", lambda *a, **k: built.append(a))
    cfg = load("bert-tiny", [f"data.path={builds['none']}", "data.seq_len=32", "model.max_position_embeddings=32",
                             f"out_dir={tmp_path / 'run'}", "data.num_workers=0"])
    with pytest.raises(ConfigError, match="built with --structure none, without the sentences that token masking"):
        Trainer(cfg)
    assert built == []
