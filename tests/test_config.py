"""The training config: YAML presets with `base`, --set overrides and coercion, unknown keys, validation."""
import glob
import json
import os
import re

import pytest
import yaml

from pretrain import config as C
from pretrain.config import Config, ConfigError, load
from pretrain.models.config import ARCH_FEATURES, ModelConfig
from pretrain.objectives.ernie import ErnieStage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
TOP_KEYS = "seed, out_dir, precision, grad_accum_dtype, deepspeed_config, kernels, fused_lm_loss, model, data, train, optimizer, checkpoint, parallel, zero, fp16, ernie, electra, unilm, xlnet, distill, sbo"
OPTIMIZER_KEYS = "name, lr, weight_decay, betas, eps, schedule, warmup_steps, min_lr, decay_steps, poly_power, multi_tensor"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.fixture
def child(tmp_path):
    """sub/child.yaml starting from ../parent.yaml."""
    write(tmp_path / "parent.yaml", "seed: 7\nmodel:\n  hidden_size: 64\n  num_heads: 4\noptimizer:\n  lr: 1e-4\n"
                                    "  betas: [0.8, 0.9]\ndata:\n  path: parent-data\n")
    return write(tmp_path / "sub" / "child.yaml",
                 "base: ../parent.yaml\nmodel:\n  num_layers: 3\ntrain:\n  steps: 50\n")


def test_base_is_relative_to_the_file_and_merges_key_by_key(child):
    cfg = load(child)
    assert (cfg.seed, cfg.model.hidden_size, cfg.model.num_heads, cfg.model.num_layers) == (7, 64, 4, 3)
    assert cfg.train.steps == 50 and cfg.data.path == "parent-data"
    assert cfg.optimizer.lr == 1e-4 and isinstance(cfg.optimizer.lr, float)  # YAML reads 1e-4 as a string
    assert cfg.optimizer.betas == [0.8, 0.9]
    assert cfg.model.ffn_hidden_size == C.ModelConfig().ffn_hidden_size  # untouched keys keep their defaults


def test_base_can_name_a_preset_and_presets_load_by_name(tmp_path):
    path = write(tmp_path / "mine.yaml", "base: bert-tiny\ntrain:\n  steps: 10\n")
    cfg = load(path)
    assert cfg.train.steps == 10 and cfg.model.hidden_size == load("bert-tiny").model.hidden_size == 128
    with pytest.raises(ConfigError, match="config file nope.yaml not found .*preset: albert-base, albert-tiny, bart-base, bart-tiny, bert-base, bert-large"):
        load("nope.yaml")
    with pytest.raises(ConfigError, match=r"file bert-tinny not found in \S+ \(did you mean bert-tiny\?\); give"):
        load("bert-tinny")


def test_a_key_given_twice_in_a_file_is_an_error(tmp_path):
    """YAML keeps the last of two equal keys silently; a config names the key and where it is given again."""
    path = write(tmp_path / "twice.yaml", "train:\n  steps: 5\n  steps: 7\n")
    with pytest.raises(ConfigError) as e:
        load(str(path))
    assert str(e.value) == f"{path}: not valid YAML: key 'steps' is given twice; keep one in \"{path}\", line 3, " \
                           "column 3"
    merged = write(tmp_path / "merged.yaml", "model:\n  <<: {num_layers: 3, hidden_size: 64}\n  hidden_size: 32\n")
    assert (load(merged).model.num_layers, load(merged).model.hidden_size) == (3, 32)  # YAML merge keys: as before
    with pytest.raises(ConfigError, match="not valid YAML: while constructing a mapping .* found unhashable key"):
        load(write(tmp_path / "list-key.yaml", "? [1, 2]\n: x\n"))


def test_base_cycle_is_an_error(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="`base` loops back"):
        load(str(tmp_path / "a.yaml"))


@pytest.mark.parametrize("item, key, value", [
    ("train.steps=1000", "train.steps", 1000),
    ("train.steps=1e3", "train.steps", 1000),
    ("optimizer.lr=3e-4", "optimizer.lr", 3e-4),
    ("optimizer.lr=1", "optimizer.lr", 1.0),
    ("zero.offload=yes", "zero.offload", True),
    ("zero.offload=false", "zero.offload", False),
    ("out_dir=runs/a=b", "out_dir", "runs/a=b"),
    ("out_dir=2024", "out_dir", "2024"),
    ("data.path=[a, b]", "data.path", ["a", "b"]),
    ("data.path=123", "data.path", "123"),
    ("data.weights=[1, 2.5]", "data.weights", [1.0, 2.5]),
    ("data.weights=null", "data.weights", None),
    ("optimizer.betas=[0.9,0.95]", "optimizer.betas", [0.9, 0.95]),
    ("optimizer.warmup_steps=0.1", "optimizer.warmup_steps", 0.1),
    ("optimizer.warmup_steps=100", "optimizer.warmup_steps", 100),
    ("model.activation_checkpointing=true", "model.activation_checkpointing", True),
    ("model.activation_checkpointing=[0, 1]", "model.activation_checkpointing", [0, 1]),
    ("ernie.task_data.ir_relevance=/data/ir", "ernie.task_data", {"ir_relevance": "/data/ir"}),
    ("ernie.stages=[{steps: 5, tasks: {capitalization: 2}}]", "ernie.stages",
     [ErnieStage(5, {"capitalization": 2.0})]),
])
def test_set_coerces_to_the_field_type(child, item, key, value):
    got = load(child, [item]).get(key)
    assert got == value and type(got) is type(value)


def test_set_reaches_into_a_list_element():
    """`ernie.stages.0.steps=2`: one field of one element (the stages' sum must meet train.steps, so that a shorter
    run needs no whole-list override), also of a list no file sets (the field's default); an element that does not
    exist names the list's size and the fix."""
    cfg = load("ernie-tiny", ["ernie.stages.0.steps=2", "ernie.stages.1.tasks.capitalization=3", "train.steps=6"])
    cfg.validate()
    base = load("ernie-tiny").ernie.stages
    assert [s.steps for s in cfg.ernie.stages] == [2, base[1].steps]
    assert cfg.ernie.stages[1].tasks["capitalization"] == 3
    assert cfg.ernie.stages[0].tasks == base[0].tasks  # the rest of the element kept
    with pytest.raises(ConfigError, match=r"ernie.stages has 2 elements, no element 5; set the whole list"):
        load("ernie-tiny", ["ernie.stages.5.steps=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'ernie.stages.0.step'"):
        load("ernie-tiny", ["ernie.stages.0.step=1"])
    assert load("bert-tiny", ["optimizer.betas.1=0.98"]).optimizer.betas == [0.9, 0.98]  # an element of the default


def test_set_merges_a_section_and_applies_in_order(child):
    cfg = load(child, ["model={num_layers: 5}", "train.steps=1", "train.steps=2"])
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.train.steps) == (5, 64, 2)


def test_unknown_key_in_yaml_names_the_file_key_and_valid_keys(tmp_path):
    path = write(tmp_path / "bad.yaml", "optimizer:\n  lrr: 0.1\n")
    with pytest.raises(ConfigError) as e:
        load(path)
    assert str(e.value) == (f"{path}: unknown key 'optimizer.lrr' (did you mean lr?); valid keys of optimizer: "
                            f"{OPTIMIZER_KEYS}")


def test_unknown_key_in_a_base_file_names_that_file(tmp_path):
    bad = write(tmp_path / "parent.yaml", "sed: 1\n")
    path = write(tmp_path / "child.yaml", "base: parent.yaml\n")
    with pytest.raises(ConfigError) as e:
        load(path)
    assert str(e.value) == f"{bad}: unknown key 'sed' (did you mean seed?); valid keys of the top level: {TOP_KEYS}"


def test_unknown_key_in_a_list_of_sections(tmp_path):
    path = write(tmp_path / "bad.yaml", "ernie:\n  stages:\n    - steps: 3\n      taskz: {}\n")
    with pytest.raises(ConfigError, match=re.escape("unknown key 'ernie.stages[0].taskz' (did you mean tasks?); valid "
                                                    "keys of ernie.stages[0]: steps, tasks")):
        load(path)


@pytest.mark.parametrize("item, message", [
    ("optimizer.lrr=0.1", (f"--set optimizer.lrr=0.1: unknown key 'optimizer.lrr' (did you mean lr?); valid keys of "
                          f"optimizer: {OPTIMIZER_KEYS}")),
    ("modle.hidden_size=8", f"--set modle.hidden_size=8: unknown key 'modle' (did you mean model?); valid keys of the "
                            f"top level: {TOP_KEYS}"),
    ("train.steps=abc", "--set train.steps=abc: train.steps: expected int, got 'abc'"),
    ("train.steps=1.5", "--set train.steps=1.5: train.steps: expected int, got 1.5"),
    ("zero.offload=maybe", "--set zero.offload=maybe: zero.offload: expected bool, got 'maybe'"),
    ("data.weights=[1, x]", "--set data.weights=[1, x]: data.weights[1]: expected float, got 'x'"),
    ("train.steps.x=1", "--set train.steps.x=1: train.steps is a value (int), not a section"),
    ("train.steps", "--set 'train.steps': expected KEY=VALUE, e.g. --set train.steps=1000"),
])
def test_bad_set_items(child, item, message):
    with pytest.raises(ConfigError) as e:
        load(child, [item])
    assert str(e.value) == message


def test_type_error_in_yaml_names_file_and_key(tmp_path):
    path = write(tmp_path / "bad.yaml", "model:\n  activation_checkpointing: sometimes\n")
    with pytest.raises(ConfigError, match="bad.yaml: model.activation_checkpointing: expected bool | list"):
        load(path)


# ------------------------------------------------------------------------------------------ validation

def problems(overrides, dp=1, preset="bert-tiny"):
    with pytest.raises(ConfigError) as e:
        load(preset, overrides).validate(dp=dp)
    lines = str(e.value).splitlines()
    assert all("; " in line for line in lines), lines  # every line says what is wrong, then the fix
    return lines


@pytest.mark.parametrize("overrides, dp, expected", [
    (["model.num_heads=3"], 1, "model.hidden_size=128 is not divisible by model.num_heads=3"),
    (["electra.rtd_weight=1"], 1, "electra.rtd_weight=1.0 is not read with data.objective=mlm_nsp, only with "
                                  "objective electra; remove it"),  # (other objectives' sections did nothing)
    (["xlnet.perm_size=8"], 1, "xlnet.perm_size=8 is not read with data.objective=mlm_nsp, only with objective plm"),
    (["distill.temperature=5"], 1, "distill.temperature=5.0 is not read with data.objective=mlm_nsp, only with "
                                   "objective distil"),
    (["parallel.tp=4"], 1, "model.num_heads=2 is not divisible by parallel.tp=4; use a parallel.tp that divides it"),
    (["parallel.tp=2", "model.ffn_hidden_size=511"], 1, "model.ffn_hidden_size=511 is not divisible by parallel.tp=2"),
    (["parallel.tp=2", "model.vocab_pad_to=127"], 1, "model.vocab_pad_to=127 is not divisible by parallel.tp=2"),
    (["parallel.tp=2", "model.hidden_size=129", "model.num_heads=1"], 1,
     "model.hidden_size=129 is not divisible by parallel.tp=2"),
    (["train.global_batch_size=40"], 1, ("train.global_batch_size=40 is not divisible by train.micro_batch_size x "
                                        "data-parallel size = 16 x 1 = 16; set train.global_batch_size to a multiple "
                                        "of 16")),
    ([], 3, "train.global_batch_size=32 is not divisible by train.micro_batch_size x data-parallel size = 16 x 3 = 48"),
    ([], 0, "data-parallel size 0 must be positive"),
    (["precision=fp8"], 1, "precision='fp8' is not one of fp32 | bf16 | fp16; set precision to one of them"),
    (["optimizer.name=sgd"], 1, "optimizer.name='sgd' is not one of adamw | lamb"),
    (["optimizer.schedule=step"], 1, "optimizer.schedule='step' is not one of linear | poly | cosine | constant"),
    (["zero.stage=4"], 1, "zero.stage=4 is not one of 0 | 1 | 2 | 3"),
    (["fp16.initial_scale_power=64"], 1, "fp16.initial_scale_power=64 is outside [0, 63]; set fp16.initial_scale_power "
                                         "to a value in [0, 63]"),  # (DeepSpeed's int overflow, a traceback)
    (["parallel.timeout_s=10", "parallel.heartbeat_s=10"], 1,
     "parallel.heartbeat_s=10.0 is not below parallel.timeout_s=10"),
    (["model.arch=bort"], 1, "model.arch='bort' is not one of bert | gpt2 | gpt3 | ernie"),
    (["data.objective=mlm_xyz"], 1, "data.objective='mlm_xyz' is not one of mlm_nsp | mlm_sop | mlm | clm | ernie"),
    (["data.masking=random"], 1,
     "data.masking='random' is not one of token | whole_word | span | ngram | correction | knowledge"),
    (["data.similar_words=nope.txt"], 1, "data.similar_words is set but data.masking=token; similar words replace"),
    (["data.similar_words=nope.txt", "data.masking=correction"], 1, "data.similar_words=nope.txt not found"),
    (["data.seq_len=256"], 1, ("data.seq_len=256 needs 256 positions but model.max_position_embeddings=128; lower "
                              "data.seq_len or raise model.max_position_embeddings")),
    (["model.arch=roberta", "model.pad_token_id=1", "data.objective=mlm", "data.seq_len=127"], 1,
     "data.seq_len=127 needs 129 positions but model.max_position_embeddings=128; lower data.seq_len or raise "
     "model.max_position_embeddings (position 0 is row pad_token_id + 1 = 2)"),
    (["model.position_offset=2", "data.seq_len=127"], 1, "data.seq_len=127 needs 129 positions but "
     "model.max_position_embeddings=128; lower data.seq_len or raise model.max_position_embeddings (position 0 is row "
     "model.position_offset = 2)"),
    (["zero.stage=0", "zero.offload=true"], 1, "zero.offload needs ZeRO; set zero.stage=1"),
    (["train.steps=0"], 1, "train.steps=0 must be positive"),
    (["optimizer.weight_decay=-1"], 1, "optimizer.weight_decay=-1.0 must not be negative"),
    (["data.mask_prob=0"], 1, "data.mask_prob=0.0 is outside (0, 1)"),
    (["model.hidden_dropout=1"], 1, "model.hidden_dropout=1.0 is outside [0, 1)"),
    (["optimizer.betas=[0.9]"], 1, "optimizer.betas=[0.9] must be two values in [0, 1)"),
    (["train.batch_rampup=[8, 8]"], 1, "train.batch_rampup=[8, 8] is not [START, INCREMENT, SAMPLES] with 0 < START < "
                                       "train.global_batch_size=32, whole INCREMENTs between them and SAMPLES > 0"),
    (["train.batch_rampup=[8, 10, 1000]"], 1, "train.batch_rampup=[8, 10, 1000] is not [START, INCREMENT, SAMPLES]"),
    (["train.batch_rampup=[32, 8, 1000]"], 1, "train.batch_rampup=[32, 8, 1000] is not [START, INCREMENT, SAMPLES]"),
    (["train.micro_batch_size=auto", "train.batch_rampup=[6, 2, 1000]"], 4, "train.batch_rampup=[6, 2, 1000]: every "
     "global batch of the ramp must be a whole number of samples per data-parallel rank (data-parallel size 4); make "
     "START and INCREMENT multiples of 4"),
    (["train.batch_rampup=[8, 8, 1000]", "train.steps=100", "optimizer.warmup_steps=80"], 1,
     "optimizer.warmup_steps=80 is longer than the run: train.steps=100 under train.batch_rampup read 54.50 whole "
     "batches of train.global_batch_size; shorten the warmup"),
    (["train.batch_rampup=[8, 8, 1000]", "train.steps=100", "optimizer.warmup_steps=40", "optimizer.decay_steps=0.5"],
     1, "optimizer.decay_steps=0.5 ends the decay at 27 whole batches, not after the warmup's 40 whole batches"),
    (["model.arch=xlnet", "model.type_vocab_size=0", "model.mem_len=16", "data.objective=plm",
      "data.pack_documents=true", "train.batch_rampup=[16, 16, 1000]"], 1,
     "train.batch_rampup changes the global batch, which is the number of streams that data.streams and "
     "model.mem_len read along; remove train.batch_rampup"),
    (["train.skip_steps=[[5, 3]]"], 1, "train.skip_steps[0]=[5, 3] is not a [first, last] pair of steps (1 <= "
                                       "first <= last); write e.g. train.skip_steps=[[1201,1300]]"),
    (["train.skip_steps=[[1, 2], [7]]"], 1, "train.skip_steps[1]=[7] is not a [first, last] pair"),
    (["train.skip_steps=[[0, 2]]"], 1, "train.skip_steps[0]=[0, 2] is not a [first, last] pair"),
    (["data.path="], 1, "data.path is empty; set data.path=DIR"),
    (["data.path=[a, b]", "data.weights=[1]"], 1, "data.weights=[1.0] must be one positive weight per data.path (2)"),
    (["data.path=[a, b]", "data.weights=[1, 0]"], 1, "must be one positive weight per data.path"),
    (["data.max_predictions_per_seq=65"], 1, "data.max_predictions_per_seq=65 exceeds data.seq_len=64"),
    (["optimizer.warmup_steps=1201"], 1, "optimizer.warmup_steps=1201 is longer than train.steps=1200; shorten the "
     "warmup (a fraction below 1 is one of the run, such as optimizer.warmup_steps=0.1)"),
    (["optimizer.warmup_steps=2.5"], 1, "optimizer.warmup_steps=2.5 is neither whole steps nor a fraction below 1"),
    (["optimizer.min_lr=0.1"], 1, "optimizer.min_lr=0.1 exceeds optimizer.lr=0.002"),
    (["optimizer.warmup_steps=10", "optimizer.decay_steps=10"], 1, "optimizer.decay_steps=10 ends the decay at step 10, "
     "not after the warmup's 10 steps; make it longer (0: decay until train.steps)"),
    (["optimizer.decay_steps=2.5"], 1, "optimizer.decay_steps=2.5 is neither whole steps nor a fraction below 1"),
    (["model.activation_checkpointing=[1, 2]"], 1, "model.activation_checkpointing=[1, 2] names layers outside 0..1"),
    (["data.objective=clm"], 1, "data.objective=clm does not fit model.arch=bert"),
    (["model.arch=gpt2"], 1, "data.objective=mlm_nsp does not fit model.arch=gpt2"),
    (["model.arch=gpt2", "data.objective=clm"], 1, "model.type_vocab_size=2: causal LM samples have one segment"),
    (["model.task_type_vocab_size=3"], 1, "model.task_type_vocab_size=3 needs model.arch=ernie"),
    (["model.type_vocab_size=0"], 1, "data.objective=mlm_nsp pairs two segments but model.type_vocab_size=0"),
    (["ernie.stages=[{steps: 300, tasks: {capitalization: 1}}]"], 1, "ernie.stages is set but data.objective=mlm_nsp"),
    (["precision=bf16", "zero.stage=0"], 1, "precision=bf16 with grad_accum_dtype=fp32 needs ZeRO"),
    (["data.pack_documents=false"], 1, "data.pack_documents=false applies to data.objective=clm, not mlm_nsp"),
    (["data.streams=true"], 1, "data.streams=true reads windows along streams of one dataset's packed documents: "
                               "it needs data.objective clm or plm (not mlm_nsp)"),
    (["model.generator_size=0.25"], 1, "model.generator_size=0.25 with model.heads=['mlm', 'nsp']: ELECTRA's rtd head"),
    (["data.objective=electra"], 1, "data.objective=electra trains the rtd head but model.heads=['mlm', 'nsp']; set "
                                    "model.arch=electra"),
    (["model.arch=electra"], 1, "model.generator_size=0.0 with model.heads=['rtd']"),
    (["model.arch=electra", "model.generator_size=0.25"], 1, "data.objective=mlm_nsp trains the model's mlm head"),
    (["model.arch=electra", "model.generator_size=0.25", "data.objective=electra", "parallel.tp=2"], 1,
     "model.generator_size=0.25 gives a generator of hidden size 32, 1 heads and MLP width 128, which parallel.tp=2"),
    (["model.arch=electra", "model.generator_size=1.5", "data.objective=electra"], 1,
     "model.generator_size=1.5 is outside [0, 1]"),
    (["model.norm_type=rmsnorm"], 1, "model.norm_type=rmsnorm needs model.norm=pre"),
    (["model.arch=xlnet", "model.type_vocab_size=0", "model.mem_len=16", "data.objective=mlm"], 1,
     "model.mem_len=16 carries a memory along streams of one dataset's packed documents: it needs a data.objective "
     "whose samples stream (XLNet's plm, Transformer-XL's clm; not mlm)"),
    (["model.arch=xlnet", "model.type_vocab_size=0", "model.mem_len=16", "data.objective=plm",  # only what is wrong
      "data.pack_documents=true", "data.path=[a, b]"], 1, "it needs one data.path (not 2); or set model.mem_len=0"),
    (["data.objective=mlm", "data.short_seq_prob=0"], 1, "data.short_seq_prob=0.0 is not read with data.objective=mlm, "
                                                         "only with objective mlm_nsp | mlm_sop | unilm; remove it"),
    (["model.relative_buckets=64"], 1, "model.relative_buckets=64 is not read with model.position_encoding=learned "
                                       "(model.arch=bert's), only with position_encoding bucketed; remove it"),
    (["model.attention_window=16"], 1, "model.attention_window=16 is not read with model.attention_layers=[global] "
                                       "(model.arch=bert's), only with attention_layers local; remove it"),
    (["model.pad_token_id=1"], 1, "model.pad_token_id=1 is not read with model.position_encoding=learned"),
    (["model.arch=roberta", "data.objective=mlm", "model.position_offset=2"], 1,
     "model.position_offset=2 is not read with model.position_encoding=roberta (model.arch=roberta's), only with "
     "position_encoding learned; remove it"),  # (RoBERTa's positions start past the padding id)
    (["model.position_encoding=bucketed"], 1, "model.position_encoding=bucketed is T5's relative bias of an "
                                              "encoder-decoder; set model.decoder_layers"),
])
def test_validation_errors(overrides, dp, expected):
    lines = problems(overrides, dp)
    assert any(expected in line for line in lines), lines


@pytest.mark.parametrize("preset, overrides, expected", [
    ("xlnet-tiny", ["model.causal=true"], "model.position_encoding=transformer_xl, model.causal=True; set "
                                          "model.causal=false"),
    ("t5-tiny", ["model.decoder_layers=0"], "model.decoder_layers=0; set model.decoder_layers to 1 or more"),
    ("elmo-tiny", ["model.char_filters=[]"], "model.char_filters=[] must be [width, filters] pairs"),
])
def test_a_family_own_presets_are_not_told_to_become_that_family(preset, overrides, expected):
    """The fix an objective's check gives, where the model already is the objective's family: the key that is off,
    not `set model.arch=` the arch it has."""
    lines = problems([*overrides, "data.path=unused"], preset=preset)
    assert any(expected in line for line in lines) and not any("set model.arch=" in line for line in lines), lines


@pytest.mark.parametrize("overrides, expected", [
    (["model.arch=bert"], "data.objective=ernie needs model.arch=ernie"),
    (["ernie.stages=[]"], "data.objective=ernie needs ernie.stages"),
    (["ernie.stages=[{steps: 8, tasks: {knowledge_mask: 1}}]"],
     "ernie.stages[0].tasks: unknown task 'knowledge_mask'; valid tasks: knowledge_masking, capitalization"),
    (["ernie.stages=[{steps: 8, tasks: {capitalization: 0}}]"], ("ernie.stages[0].tasks.capitalization=0.0: sampling "
                                                                "weights must be positive")),
    (["ernie.stages=[{steps: 8, tasks: {}}]"], "ernie.stages[0].tasks is empty"),
    (["ernie.stages=[{steps: 0, tasks: {capitalization: 1}}, {steps: 8, tasks: {capitalization: 1}}]"],
     "ernie.stages[0].steps=0 must be positive"),
    (["ernie.stages=[{steps: 8, tasks: {ir_relevance: 1}}]"], ("ernie.stages[0].tasks: ir_relevance needs labelled "
                                                              "data; set ernie.task_data.ir_relevance=PATH")),
    (["ernie.task_data.capitalization=x"], ("ernie.task_data.capitalization: only discourse_relation and "
                                           "ir_relevance take a dataset")),
    (["train.steps=10"], "ernie.stages add up to 8 steps but train.steps=10; make them equal"),
    (["ernie.stages=[{steps: 4, tasks: {capitalization: 1}}, {steps: 4, tasks: {sentence_distance: 1}}]"],
     "ernie.stages[1].tasks drops capitalization of the stage before"),
])
def test_ernie_validation_errors(overrides, expected):
    lines = problems(overrides, preset="ernie-tiny")
    assert any(expected in line for line in lines), lines


def test_user_labeled_task_with_data_validates():
    load("ernie-tiny", ["ernie.stages=[{steps: 8, tasks: {discourse_relation: 1, knowledge_masking: 2}}]",
                        "ernie.task_data.discourse_relation=/data/dr"]).validate()


def test_all_problems_are_reported_at_once():
    assert len(problems(["optimizer.name=sgd", "precision=fp8", "train.steps=0"])) == 3


# -------------------------------------------------------------------------------------------- presets

@pytest.mark.parametrize("path", PRESETS, ids=os.path.basename)
def test_preset_loads_validates_and_round_trips(path):
    with open(path) as f:
        assert f.readline().startswith("# ")  # what the preset is, in one line
    cfg = load(path)
    cfg.validate(dp=1)
    assert Config.from_dict(yaml.safe_load(cfg.to_yaml())) == cfg
    assert cfg.to_dict()["model"]["hidden_size"] == cfg.model.hidden_size


def test_the_required_presets_exist():
    names = {os.path.basename(p)[:-5] for p in PRESETS}
    assert {"bert-base", "bert-large", "bert-tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt2-tiny",
            "ernie-base", "ernie2-base", "ernie-tiny", "roberta-base", "roberta-tiny", "albert-base",
            "albert-tiny", "macbert-base", "macbert-tiny"} <= names


def shape(cfg):
    m = cfg.model
    return m.arch, m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size, m.max_position_embeddings, m.vocab_size


def test_preset_shapes():
    assert shape(load("bert-base")) == ("bert", 12, 768, 12, 3072, 512, 30522)
    assert shape(load("bert-large")) == ("bert", 24, 1024, 16, 4096, 512, 30522)
    assert shape(load("gpt2")) == ("gpt2", 12, 768, 12, 3072, 1024, 50257)
    assert shape(load("gpt2-medium"))[1:4] == (24, 1024, 16)
    assert shape(load("gpt2-large"))[1:4] == (36, 1280, 20)
    assert shape(load("gpt2-xl"))[1:4] == (48, 1600, 25)
    roberta = load("roberta-base")
    assert shape(roberta) == ("roberta", 12, 768, 12, 3072, 514, 50265) and roberta.model.type_vocab_size == 1
    assert (roberta.data.objective, roberta.optimizer.betas, roberta.model.heads) == ("mlm", [0.9, 0.98], ["mlm"])
    tiny = load("bert-tiny")
    assert shape(tiny)[:4] == ("bert", 2, 128, 2) and tiny.data.seq_len == 64 and tiny.optimizer.lr == 2e-3
    assert 100 <= tiny.train.steps <= 2000
    assert load("ernie-base").data.masking == "knowledge"
    ernie2 = load("ernie2-base")
    assert ernie2.model.task_type_vocab_size == 3 and len(ernie2.ernie.stages) == 2
    ernie_tiny = load("ernie-tiny")
    assert [s.steps for s in ernie_tiny.ernie.stages] == [4, 4] and ernie_tiny.train.steps == 8


# ------------------------------------------------------------------- keys that the objective or model does not read

MASKED = "mlm_nsp | mlm_sop | mlm | ernie | electra | unilm | distil | tinybert | mlm_sbo"


@pytest.mark.parametrize("files, overrides, refused, noted", [
    # given beside the choice: in the file that makes it, in a file based on that one, by --set: refused
    ({"run.yaml": "base: gpt2-tiny\ndata:\n  objective: clm\n  mask_prob: 0.3\n"}, [],
     f"data.mask_prob=0.3 is not read with data.objective=clm, only with objective {MASKED}; remove it", None),
    ({"gpt.yaml": "base: bert-tiny\nmodel:\n  arch: gpt2\n  type_vocab_size: 0\ndata:\n  objective: clm\n",
      "run.yaml": "base: gpt.yaml\ndata:\n  masking: span\n"}, [],
     f"data.masking=span is not read with data.objective=clm, only with objective {MASKED.replace('ernie | ', '')}; "
     "remove it", None),
    ({"run.yaml": "base: gpt2-tiny\ndata:\n  mask_prob: 0.3\n"}, ["data.objective=clm"],  # a choice restated is
     "data.mask_prob=0.3 is not read with data.objective=clm", None),  # the base's still (once a note)
    ({"run.yaml": "base: gpt2-tiny\n"}, ["data.similar_words=/nonexistent.txt"],  # one line (were three)
     "data.similar_words=/nonexistent.txt is not read with data.objective=clm", None),
    ({"run.yaml": "base: gpt2-tiny\n"}, ["data.max_predictions_per_seq=20"],
     "data.max_predictions_per_seq=20 is not read with data.objective=clm", None),
    ({"run.yaml": "base: t5-tiny\n"}, ["data.masking=token"], "data.masking=token is not read with "
                                                               "data.objective=span_corruption", None),
    ({"run.yaml": "base: bert-tiny\nprecision: bf16\n"}, ["fp16.hysteresis=1"],  # (fp16's loss scaling, did nothing)
     "fp16.hysteresis=1 is not read with precision=bf16, only with precision fp16; remove it", None),
    ({"run.yaml": "base: bert-tiny\ngrad_accum_dtype: bf16\n"}, [],
     "grad_accum_dtype=bf16 is not read with precision=fp32, only with precision bf16; remove it", None),
    ({"run.yaml": "base: bert-tiny\nmodel:\n  clamp_len: 8\n"}, [],
     "model.clamp_len=8 is not read with model.position_encoding=learned (model.arch=bert's), only with "
     "position_encoding transformer_xl; remove it", None),
    ({"run.yaml": "base: nezha-tiny\nmodel:\n  position_encoding: learned\n  max_relative_position: 8\n"}, [],
     "model.max_relative_position=8 is not read with model.position_encoding=learned, only with position_encoding "
     "relative; remove it", None),
    ({"run.yaml": "base: nezha-tiny\n"}, ["model.arch=bert", "model.max_relative_position=8"],
     "model.max_relative_position=8 is not read with model.position_encoding=learned (model.arch=bert's)", None),
    # given only by an earlier base, a preset of another objective or model: accepted, and noted
    ({"run.yaml": "base: bert-large\nmodel:\n  arch: gpt2\n  type_vocab_size: 0\ndata:\n  objective: clm\n"}, [],
     None, "data.masking=whole_word (from bert-large.yaml) is not read with data.objective=clm (from {run}): ignored"),
    ({"run.yaml": "base: nezha-tiny\n"}, ["model.position_encoding=learned"], None,
     "model.max_relative_position=16 (from nezha-tiny.yaml) is not read with model.position_encoding=learned (from "
     "--set): ignored"),
    ({"run.yaml": "base: nezha-tiny\n"}, ["model.arch=bert"], None,
     "model.max_relative_position=16 (from nezha-tiny.yaml) is not read with model.position_encoding=learned "
     "(model.arch=bert's) (from --set): ignored"),
    ({"run.yaml": "base: gpt3-tiny\nmodel:\n  attention_layers: [global]\n"}, [], None,
     "model.attention_window=16 (from gpt3-tiny.yaml) is not read with model.attention_layers=[global] (from {run}): "
     "ignored"),
    ({"run.yaml": "base: distilbert-tiny\ndata:\n  objective: mlm\n"}, [], None,  # another objective's section
     "distill.teacher=runs/demo/bert-tiny-4l (from distilbert-tiny.yaml) is not read with data.objective=mlm (from "
     "{run}): ignored"),
    ({"run.yaml": "base: ernie2-base\n"}, [], None, None),  # ERNIE 2.0 masks knowledge whatever data.masking says:
    # ERNIE 1.0's knowledge there says what happens, no note
])
def test_a_key_the_objective_or_model_does_not_read(tmp_path, files, overrides, refused, noted):
    """A key that only other objectives, position encodings or attention kinds read (data.mask_prob with clm, T5's
    relative_buckets with BERT's positions, ...) was accepted and did nothing. Given at or after the layer that made
    the choice it is refused in one line; given only by an earlier base (a preset of another objective) it is
    accepted, and the run's log and `ptm plan` say once that it is ignored."""
    for name, text in files.items():
        write(tmp_path / name, text)
    cfg = load(str(tmp_path / "run.yaml"), overrides)
    if refused:
        with pytest.raises(ConfigError) as e:
            cfg.validate()
        lines = str(e.value).splitlines()
        assert len(lines) == 1 and refused in lines[0], lines  # that alone, in one line
    else:
        cfg.validate()
        assert cfg.ignored() == ([noted.format(run=tmp_path / "run.yaml")] if noted else [])


def test_a_run_config_written_out_whole_loads_with_the_keys_it_does_not_read(tmp_path):
    """A run's config.yaml (resume, `ptm plan --check`) holds every key, beside its objective: none is refused, those
    with values of their own are noted; a --set on it is a choice like any other. A checkpoint of a run that gave a
    key unread resumes without it: neither model reads it, so it is none of the model's identity."""
    from pretrain.checkpoint_manager import resume_mismatches

    write(tmp_path / "gpt.yaml", "base: bert-large\nmodel:\n  arch: gpt2\n  type_vocab_size: 0\ndata:\n"
                                 "  objective: clm\n")
    saved = write(tmp_path / "run" / "config.yaml", load(str(tmp_path / "gpt.yaml")).to_yaml())
    cfg = load(saved)
    cfg.validate()
    assert cfg.ignored() == [f"data.masking=whole_word (from {saved}, a config written out whole) is not read with "
                             "data.objective=clm: ignored"]
    old = yaml.safe_load(open(saved))
    old["model"]["relative_buckets"] = 64  # an earlier version's run that gave it, unread
    del old["data"]["streams"], old["train"]["deterministic"]  # (keys that version did not have)
    load(write(tmp_path / "old" / "config.yaml", yaml.safe_dump(old))).validate()
    with pytest.raises(ConfigError, match="data.mask_prob=0.3 is not read with data.objective=clm"):
        load(saved, ["data.mask_prob=0.3"]).validate()
    meta = {"model": old["model"], "run": {}}
    identity = {"tokenizer_sha256": "", "vocab_size": 0, "objective": "clm", "datasets": []}
    assert resume_mismatches("ckpt", meta, cfg, identity) == []
    meta["model"] = dict(old["model"], hidden_size=old["model"]["hidden_size"] * 2)
    assert "model.hidden_size=" in resume_mismatches("ckpt", meta, cfg, identity)[0]


def test_the_keys_a_set_gives():
    """Where a --set gives a key (the layer a key comes from): a list's or a mapping's element gives the whole key, a
    section its keys."""
    from pretrain import yaml_config as Y

    assert Y.given("model.clamp_len=8", Config) == ["model.clamp_len"]
    assert Y.given("ernie.stages.0.steps=4", Config) == ["ernie.stages"]
    assert Y.given("unilm.mix.seq2seq=1", Config) == ["unilm.mix"]
    assert Y.given("model={clamp_len: 8, mem_len: 4}", Config) == ["model.clamp_len", "model.mem_len"]
    assert load("bert-tiny", ["model={clamp_len: 8}"]).provenance.origin["model.clamp_len"] == 2  # after 2 files


def test_ernie_stage_at():
    ernie = load("ernie-tiny").ernie
    first, second = ernie.stages
    assert [ernie.stage_at(s) is first for s in range(4)] == [True] * 4
    assert ernie.stage_at(4) is second and ernie.stage_at(7) is second and ernie.stage_at(100) is second


def test_warmup_steps_or_fraction():
    assert load("bert-tiny", ["optimizer.warmup_steps=0.1"]).optimizer.warmup(300) == 30
    assert load("bert-tiny", ["optimizer.warmup_steps=25"]).optimizer.warmup(300) == 25


def test_model_features_come_from_the_arch_unless_set():
    """The model reads features; `arch` only fills those a config leaves unset, and the resolved config (what
    checkpoints keep) names every one."""
    g = load("gpt2-tiny").model
    assert (g.norm, g.activation, g.causal, g.heads, g.scaled_init) == ("pre", "gelu_tanh", True, ["lm"], True)
    b = load("bert-tiny", ["model.norm=pre", "model.heads=[mlm]"]).model
    assert (b.norm, b.activation, b.causal, b.heads, b.scaled_init) == ("pre", "gelu", False, ["mlm"], False)
    assert "norm: pre" in load("bert-tiny", ["model.norm=pre"]).to_yaml()
    assert ModelConfig(arch="gpt2").heads is not ARCH_FEATURES["gpt2"]["heads"]  # not shared between configs
    assert problems(["model.heads=[nsp]", "data.objective=mlm"]) == [
        "model.heads=['nsp'] is not one LM head and optionally nsp; set it to [lm], [mlm] or either with nsp, or [rtd] "
        "(ELECTRA)"]
    assert any("data.objective=mlm_nsp trains the model's nsp head" in p for p in problems(["model.heads=[mlm]"]))


def test_every_objective_is_one_registered_module():
    """The config's choices and help, the data factory and the trainer all come from the registry."""
    from pretrain import objectives

    assert tuple(C.OBJECTIVES) == tuple(objectives.REGISTRY) == ("mlm_nsp", "mlm_sop", "mlm", "clm", "ernie", "electra", "unilm",
                                                                    "span_corruption", "denoising", "mass", "plm", "bilm", "distil",
                                                                    "tinybert", "mlm_sbo")
    assert all(o.help and C.OBJECTIVES[name] == o.help for name, o in objectives.REGISTRY.items())
    with pytest.raises(ValueError, match="data.objective 'bort' is not one of mlm_nsp | mlm_sop"):
        objectives.get("bort")


def test_electra_weighs_its_rtd_term_by_the_config():
    """electra.rtd_weight reaches the objective the trainer computes with (objectives.get(...).configured(cfg))."""
    import torch

    from pretrain import losses, objectives

    electra = objectives.get("electra").configured(load("electra-tiny", ["electra.rtd_weight=7"]))
    terms = {"mlm": losses.Term(torch.tensor(2.0), torch.tensor(4)),
             "rtd": losses.Term(torch.tensor(3.0), torch.tensor(6), weight=electra.weight)}
    counts = {name: t.count.double() for name, t in terms.items()}
    assert electra.weight == 7 and float(losses.objective(terms, counts)) == pytest.approx(2 / 4 + 7 * 3 / 6)
    assert objectives.get("electra").configured(load("electra-tiny")).weight == 50


def test_data_paths():
    assert load("bert-tiny").data.paths == ["runs/demo/data"]
    assert load("bert-tiny", ["data.path=[a, b]"]).data.paths == ["a", "b"]


# ------------------------------------------------------------------------------------- keys and help

REQUIRED_KEYS = (
    "data.path", "data.weights", "out_dir", "train.steps", "train.global_batch_size", "train.micro_batch_size",
    "optimizer.name", "optimizer.lr", "checkpoint.interval", "precision", "parallel.tp", "zero.stage", "seed",
    "model.arch", "model.vocab_size", "model.hidden_size", "model.num_layers", "model.num_heads",
    "model.ffn_hidden_size", "model.max_position_embeddings", "model.type_vocab_size", "model.task_type_vocab_size",
    "model.layer_norm_eps", "model.hidden_dropout", "model.attention_dropout", "model.init_std",
    "model.activation_checkpointing", "data.seq_len", "data.objective", "data.mask_prob",
    "data.max_predictions_per_seq", "data.masking", "data.short_seq_prob", "data.valid_fraction", "data.num_workers",
    "train.grad_clip", "train.log_interval", "train.eval_interval", "train.eval_steps", "optimizer.weight_decay",
    "optimizer.betas", "optimizer.eps", "optimizer.schedule", "optimizer.warmup_steps", "optimizer.min_lr",
    "optimizer.poly_power", "checkpoint.keep", "zero.offload", "fp16.initial_scale_power", "fp16.loss_scale_window",
    "fp16.hysteresis", "fp16.min_loss_scale", "ernie.stages",
)


def test_required_keys_exist():
    assert set(REQUIRED_KEYS) <= set(C.keys())
    cfg = Config()
    for key in REQUIRED_KEYS:
        cfg.get(key)


def test_describe_lists_every_key_with_type_default_and_help():
    """A line per key (type, default, the description's start) at the margin, its description continued on indented
    lines, within the width asked: in a column beside the keys, or under each key where that column would be too
    narrow; a default too long for its column (unilm.mix) is cut there and said in full in the description."""
    from pretrain import schema

    for width in (118, 98, 78):
        lines = C.describe(width).splitlines()
        assert max(map(len, lines)) <= width, width
        heads = [line for line in lines if not line.startswith(" ")]
        assert [line.split()[0] for line in heads] == C.keys()
        beside = len(re.split(r"\s{2,}", heads[0])) == 4  # (else each description is under its key)
        assert beside or width < 118, width
        said = {}
        for line in lines:
            if not line.startswith(" "):
                key, type_, default, *text = re.split(r"\s{2,}", line)
                assert type_ and default and (text or not beside), line
                said[key] = text
            else:
                said[key].append(line.strip())
        for key, _, default, f in schema.leaves(C.Config):
            assert " ".join(said[key]) == " ".join(f.metadata["help"].split()) + (
                f" (default {json.dumps(default)})" if len(json.dumps(default)) > schema.DEFAULT_CELL else ""), key
    text = C.describe(118)
    assert re.search(r"^optimizer\.lr\s+float\s+0\.0001\s+peak learning rate$", text, re.MULTILINE)
    assert re.search(r"^model\.activation_checkpointing\s+bool \| list\[int\]\s+false\s+recompute", text, re.MULTILINE)
    assert re.search(r'^unilm\.mix\s+dict\[str, float\]\s+\{"bidirection\.\.\.\s+relative', text, re.MULTILINE)


def test_a_config_written_before_the_plugin_sections_loads(tmp_path):
    """A run directory's config.yaml from before the objectives owned their sections (ELECTRA's weight under data:)
    still loads, for --check, resume and export: the key is read at its new place."""
    old = tmp_path / "config.yaml"
    old.write_text("base: electra-tiny.yaml\ndata:\n  path: somewhere\n  rtd_weight: 20.0\n  seq_len: 64\n")
    import shutil

    shutil.copy(os.path.join(C.PRESETS_DIR, "electra-tiny.yaml"), tmp_path)
    shutil.copy(os.path.join(C.PRESETS_DIR, "electra-base.yaml"), tmp_path)
    cfg = C.load(str(old))
    assert cfg.electra.rtd_weight == 20.0 and cfg.data.seq_len == 64 and cfg.data.path == "somewhere"


def test_an_out_dir_that_is_a_file_and_a_compiled_elmo_are_refused_in_one_line(tmp_path):
    """`out_dir` naming a file (a FileExistsError traceback from the run log before) or a path that cannot be made
    (under a file or a directory this user cannot write: a FileNotFoundError traceback once DeepSpeed ran), and
    kernels=compile for ELMo (which has no transformer blocks to compile): one line each, with the fix."""
    path = write(tmp_path / "notes.txt", "")
    with pytest.raises(ConfigError) as e:
        load("bert-tiny", [f"out_dir={path}", "data.path=data"]).validate()
    assert str(e.value) == f"out_dir={path} is a file; set out_dir to a directory (a new one, or a run's to resume it)"
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    cases = [(f"{path}/sub/run", path, "not a directory")]  # (a FileNotFoundError traceback from the run log, late)
    cases += [(f"{locked}/run", locked, "not writable")] if not os.access(locked, os.W_OK) else []  # (root writes)
    for out, above, why in cases:
        with pytest.raises(ConfigError) as e:
            load("bert-tiny", [f"out_dir={out}", "data.path=data"]).validate()
        assert str(e.value) == f"out_dir={out} cannot be created: {above} is {why}; set out_dir under a writable " \
                               "directory"
    os.symlink(tmp_path / "gone", tmp_path / "link")  # (a FileExistsError traceback from the run log)
    for out, says in (("", "out_dir is empty; set out_dir=DIR"),  # (a FileNotFoundError traceback: '')
                      (f"{tmp_path}/link", f"out_dir={tmp_path}/link is a link to {tmp_path}/gone, which does not "
                                           "exist; create that directory, or set out_dir elsewhere")):
        with pytest.raises(ConfigError) as e:
            load("bert-tiny", [f"out_dir={out}", "data.path=data"]).validate()
        assert str(e.value).startswith(says)
    load("bert-tiny", [f"out_dir={tmp_path}/new/run", "data.path=data"]).validate()
    assert sorted(os.listdir(tmp_path)) == ["link", "locked", "notes.txt"]  # (nothing made)
    with pytest.raises(ConfigError) as e:
        load("elmo-tiny", ["kernels=compile", "data.path=data"]).validate()
    assert str(e.value) == "kernels=compile compiles transformer blocks; ELMo has none: set kernels=auto"


def test_a_latest_that_is_a_directory_is_refused_and_a_failed_pointer_write_leaves_nothing(tmp_path):
    """A run whose checkpoints/latest is a directory (once: an IsADirectoryError at its first checkpoint, after
    training, with a latest.tmpPID file left beside it): refused in one line before anything starts; and the pointer's
    write, failing, leaves no temporary file."""
    from pretrain.checkpoint import mark_latest

    latest = tmp_path / "checkpoints" / "latest"
    latest.mkdir(parents=True)
    with pytest.raises(ConfigError) as e:
        load("bert-tiny", [f"out_dir={tmp_path}", "data.path=data"]).validate()
    assert str(e.value) == f"{latest} is not a file (the name of the checkpoint to resume, which ptm writes there); " \
                           "remove it"
    with pytest.raises(IsADirectoryError):
        mark_latest(str(tmp_path), "step_00000005")
    assert os.listdir(tmp_path / "checkpoints") == ["latest"]


def test_a_mapping_valued_key_given_whole_replaces_and_unknown_mix_modes_are_named(tmp_path):
    """`unilm.mix={seq2seq: 1}` (in --set or in a file over its base) is that mix, not merged into the preset's (which
    gave seq2seq 1/7 of the samples); one share is set with unilm.mix.seq2seq=1; sections still merge key by key; a mode
    that does not exist is named."""
    preset = {"bidirectional": 2.0, "left_to_right": 1.0, "right_to_left": 1.0, "seq2seq": 2.0}
    assert load("unilm-tiny").unilm.mix == preset
    assert load("unilm-tiny", ["unilm.mix={seq2seq: 1}"]).unilm.mix == {"seq2seq": 1.0}
    assert load("unilm-tiny", ["unilm.mix.seq2seq=1"]).unilm.mix == {**preset, "seq2seq": 1.0}
    child = write(tmp_path / "child.yaml", "base: unilm-tiny\nunilm:\n  mix: {seq2seq: 1}\nmodel:\n  num_layers: 3\n")
    cfg = load(str(child))
    assert cfg.unilm.mix == {"seq2seq": 1.0} and cfg.model.num_layers == 3
    assert cfg.model.hidden_size == load("unilm-tiny").model.hidden_size
    with pytest.raises(ConfigError) as e:
        load("unilm-tiny", ["unilm.mix={foo: 1, seq2seq: 1}", "data.path=data"]).validate()
    assert str(e.value) == "unilm.mix has unknown modes foo; use bidirectional, left_to_right, right_to_left, seq2seq"


def test_skip_steps_name_ranges_that_join_where_they_overlap_or_touch():
    train = load("bert-tiny", ["train.skip_steps=[[10, 12], [5, 6], [7, 8], [11, 20]]"]).train
    assert [train.skipped(s) for s in (4, 5, 8, 9, 10, 20, 21)] == [None, (5, 8), (5, 8), None, (10, 20), (10, 20),
                                                                   None]
    assert load("bert-tiny").train.skipped(1) is None


def test_a_batch_ramp_grows_as_megatron_s_and_its_schedule_counts_samples():
    """train.batch_rampup=[START, INCREMENT, SAMPLES]: START plus one INCREMENT per whole share of SAMPLES / increments
    read (Megatron's RampupBatchsizeNumMicroBatches), the whole batch after; the learning rate of a step is the
    schedule's at the samples read before it, in steps of the whole batch."""
    from pretrain.optim import Schedule

    train = load("bert-tiny", ["train.global_batch_size=16", "train.batch_rampup=[4, 4, 30]"]).train
    assert [train.batch_at(c) for c in (0, 9, 10, 19, 20, 29, 30, 10 ** 6)] == [4, 4, 8, 8, 12, 12, 16, 16]
    before = [0]
    for _ in range(8):
        before.append(before[-1] + train.batch_at(before[-1]))
    assert before == [0, 4, 8, 12, 20, 32, 48, 64, 80] and [train.samples_before(s) for s in range(9)] == before
    assert train.samples_before(100) == 32 + 95 * 16 and train.batch_unit() == 4
    cfg = load("bert-tiny", ["train.global_batch_size=16", "train.batch_rampup=[4, 4, 30]", "optimizer.lr=1.0",
                             "optimizer.warmup_steps=4", "optimizer.schedule=linear"])
    schedule = Schedule.from_config(cfg.optimizer, 10, cfg.train)  # the run: 10 steps, 112 samples: 7 whole batches
    assert (schedule.total_steps, schedule.warmup_steps) == (7.0, 4)
    assert [schedule(schedule.position(s)) for s in (1, 6, 8)] == pytest.approx([4 / 16 / 4, 48 / 16 / 4, 1 - 1 / 3])
    assert load("bert-tiny").train.batch_unit() == load("bert-tiny").train.global_batch_size
