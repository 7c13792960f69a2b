"""GPT (Radford et al. 2018, "Improving Language Understanding by Generative Pre-Training"): a 12-layer post-LN
decoder: LayerNorm after each residual sum and none on the embeddings or at the end, learned positions (512), tanh
GELU, an MLP four times as wide, a BPE vocabulary; causal LM (pretrain/objectives/clm.py). Exports as
OpenAIGPTLMHeadModel (OpenAI's Conv1D layout, the output projection tied to the token embeddings)."""
from __future__ import annotations

from pretrain.families.base import Adapter, ExportError, Family

ORDER = 80
FEATURES = dict(norm="post", embedding_norm=False, activation="gelu_tanh", causal=True, heads=["lm"],
                scaled_init=False, position_encoding="learned", share_layers="none")


class GPTAdapter(Adapter):
    hf_class = "OpenAIGPTLMHeadModel"
    causal = True
    model_type = "openai-gpt"
    prefix = "transformer."
    layer = "{p}h.{i}."
    qkv = "attn.c_attn"
    fused_qkv = conv1d = True
    layer_keys = {  # post-LN: ln_1 after the attention's residual sum, ln_2 after the MLP's
        "attn.out.weight": "attn.c_proj.weight", "attn.out.bias": "attn.c_proj.bias",
        "attn_norm.weight": "ln_1.weight", "attn_norm.bias": "ln_1.bias",
        "mlp.fc1.weight": "mlp.c_fc.weight", "mlp.fc1.bias": "mlp.c_fc.bias",
        "mlp.fc2.weight": "mlp.c_proj.weight", "mlp.fc2.bias": "mlp.c_proj.bias",
        "mlp_norm.weight": "ln_2.weight", "mlp_norm.bias": "ln_2.bias",
    }
    keys = {"embeddings.word.weight": "{p}tokens_embed.weight", "embeddings.position.weight": "{p}positions_embed.weight"}
    tied = {"lm_head.weight": "transformer.tokens_embed.weight"}
    computes = dict(norm=("post",), embedding_norm=(False,), activation=("gelu_tanh",), causal=(True,),
                    position_encoding=("learned",), share_layers=("none",), heads=("lm",), embedding_size=(0,),
                    type_vocab_size=(0,))
    tokenizer = "none"
    tokenizer_class = "OpenAIGPTTokenizer"

    def problems(self, cfg):
        out = super().problems(cfg)
        if cfg.ffn_hidden_size != 4 * cfg.hidden_size:
            out.append(f"model.ffn_hidden_size={cfg.ffn_hidden_size} has no HF class: {self.hf_class}'s MLP is 4 x "
                       f"model.hidden_size = {4 * cfg.hidden_size} wide; keep the model in ptm's format, or train one "
                       "with that width")
        return out

    def hf_config(self, cfg, special):
        import transformers

        return transformers.OpenAIGPTConfig(
            vocab_size=cfg.vocab_size, n_positions=cfg.max_position_embeddings, n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers, n_head=cfg.num_heads, afn="gelu", resid_pdrop=cfg.hidden_dropout,
            embd_pdrop=cfg.hidden_dropout, attn_pdrop=cfg.attention_dropout, layer_norm_epsilon=cfg.layer_norm_eps,
            initializer_range=cfg.init_std, architectures=[self.hf_class])

    def model_config(self, hf):
        if hf.afn != "gelu":
            raise ExportError(f"afn={hf.afn!r}: ptm's GPT computes OpenAI GPT's tanh GELU (afn=gelu) only")
        return dict(arch="gpt", vocab_size=hf.vocab_size, vocab_pad_to=1, hidden_size=hf.n_embd, num_layers=hf.n_layer,
                    num_heads=hf.n_head, ffn_hidden_size=4 * hf.n_embd, max_position_embeddings=hf.n_positions,
                    type_vocab_size=0, task_type_vocab_size=0, layer_norm_eps=hf.layer_norm_epsilon,
                    hidden_dropout=hf.resid_pdrop, attention_dropout=hf.attn_pdrop, init_std=hf.initializer_range)


FAMILY = Family("gpt", "GPT (2018): post-LN decoder without embedding or final LayerNorm, causal LM", FEATURES,
                GPTAdapter())
