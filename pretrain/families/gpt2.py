"""GPT-2 (Radford et al. 2019): pre-LN decoder with a final LayerNorm, learned positions, tanh-approximated GELU,
residual projections initialised smaller; causal LM. Exports as GPT2LMHeadModel."""
from __future__ import annotations

from pretrain.families.base import Adapter, Family

ORDER = 20
FEATURES = dict(norm="pre", activation="gelu_tanh", causal=True, heads=["lm"], scaled_init=True,
                position_encoding="learned", share_layers="none")


class GPT2Adapter(Adapter):
    hf_class = "GPT2LMHeadModel"
    causal = True
    model_type = "gpt2"
    prefix = "transformer."
    layer = "{p}h.{i}."
    qkv = "attn.c_attn"
    fused_qkv = conv1d = True
    layer_keys = {
        "attn_norm.weight": "ln_1.weight", "attn_norm.bias": "ln_1.bias",
        "attn.out.weight": "attn.c_proj.weight", "attn.out.bias": "attn.c_proj.bias",
        "mlp_norm.weight": "ln_2.weight", "mlp_norm.bias": "ln_2.bias",
        "mlp.fc1.weight": "mlp.c_fc.weight", "mlp.fc1.bias": "mlp.c_fc.bias",
        "mlp.fc2.weight": "mlp.c_proj.weight", "mlp.fc2.bias": "mlp.c_proj.bias",
    }
    keys = {"embeddings.word.weight": "{p}wte.weight", "embeddings.position.weight": "{p}wpe.weight",
            "final_norm.weight": "{p}ln_f.weight", "final_norm.bias": "{p}ln_f.bias"}
    tied = {"lm_head.weight": "transformer.wte.weight"}
    computes = dict(norm=("pre",), embedding_norm=(None, False), activation=("gelu_tanh",), causal=(True,), position_encoding=("learned",),
                    share_layers=("none",), heads=("lm",), embedding_size=(0,), type_vocab_size=(0,))
    tokenizer = "none"
    tokenizer_class = "GPT2Tokenizer"
    stand_ins = {"unk": "eod"}  # GPT-2's tokenizer names its end of text unk, bos and eos (a byte-level BPE has no
    # unknown piece)

    def hf_config(self, cfg, special):
        import transformers

        eod = special.get("eod")
        return transformers.GPT2Config(
            vocab_size=cfg.vocab_size, n_positions=cfg.max_position_embeddings, n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers, n_head=cfg.num_heads, activation_function="gelu_new",
            n_inner=None if cfg.ffn_hidden_size == 4 * cfg.hidden_size else cfg.ffn_hidden_size,
            resid_pdrop=cfg.hidden_dropout, embd_pdrop=cfg.hidden_dropout, attn_pdrop=cfg.attention_dropout,
            layer_norm_epsilon=cfg.layer_norm_eps, initializer_range=cfg.init_std, bos_token_id=eod, eos_token_id=eod,
            architectures=[self.hf_class])

    def model_config(self, hf):
        return dict(arch="gpt2", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.n_embd,
                    num_layers=hf.n_layer, num_heads=hf.n_head, ffn_hidden_size=hf.n_inner or 4 * hf.n_embd,
                    max_position_embeddings=hf.n_positions, type_vocab_size=0, task_type_vocab_size=0,
                    layer_norm_eps=hf.layer_norm_epsilon, hidden_dropout=hf.resid_pdrop,
                    attention_dropout=hf.attn_pdrop, init_std=hf.initializer_range)


FAMILY = Family("gpt2", "GPT-2: pre-LN decoder, causal LM", FEATURES, GPT2Adapter())
