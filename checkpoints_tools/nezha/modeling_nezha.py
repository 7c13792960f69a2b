"""NEZHA (Wei et al. 2019) for Hugging Face transformers: BERT without position embeddings, whose self-attention
adds functional relative positions, fixed sinusoids of the clipped distance j - i, to the keys and to the values:

    score_ij = q_i . (k_j + a_ij) / sqrt(d)        out_i = sum_j softmax_j(score_ij) (v_j + a_ij)

Parameter names are those of the NEZHA checkpoints published for transformers (`nezha.encoder.layer.N...`,
`cls.predictions...`). Written by ptm (checkpoints_tools/nezha), tested against ptm's model and a float64
computation; load an exported directory with `AutoModel.from_pretrained(dir, trust_remote_code=True)`.
"""
import math

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling, MaskedLMOutput
from transformers.models.bert.modeling_bert import (BertForPreTrainingOutput, BertIntermediate, BertLMPredictionHead,
                                                    BertOnlyMLMHead, BertOutput, BertPooler, BertPreTrainingHeads,
                                                    BertSelfOutput)

from .configuration_nezha import NezhaConfig


def relative_position_encoding(length: int, depth: int, max_relative_position: int, device=None) -> torch.Tensor:
    """[length, length, depth]: row i, column j holds sin/cos (even/odd dimensions) of
    (clip(j - i) + max_relative_position) * 10000^(-2k / depth)."""
    positions = torch.arange(length, device=device)
    clipped = torch.clamp(positions[None, :] - positions[:, None], -max_relative_position, max_relative_position)
    table = torch.zeros(2 * max_relative_position + 1, depth, device=device)
    index = torch.arange(2 * max_relative_position + 1, device=device, dtype=torch.float).unsqueeze(1)
    rate = torch.exp(torch.arange(0, depth, 2, device=device).float() * (-math.log(10000.0) / depth))
    table[:, 0::2] = torch.sin(index * rate)
    table[:, 1::2] = torch.cos(index * rate)
    return table[clipped + max_relative_position]


class NezhaEmbeddings(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        return self.dropout(self.LayerNorm(self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)))


class NezhaSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.max_relative_position = config.max_relative_position
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, hidden_states, attention_mask=None):
        b, s, _ = hidden_states.shape
        q, k, v = (layer(hidden_states).view(b, s, self.heads, self.head_size).transpose(1, 2)
                   for layer in (self.query, self.key, self.value))  # [b, heads, s, d]
        relative = relative_position_encoding(s, self.head_size, self.max_relative_position,
                                              hidden_states.device).to(q.dtype)  # [s, s, d]
        scores = torch.matmul(q, k.transpose(-1, -2)) + torch.einsum("bhid,ijd->bhij", q, relative)
        scores = scores / math.sqrt(self.head_size)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = self.dropout(nn.functional.softmax(scores, dim=-1))
        context = torch.matmul(probs, v) + torch.einsum("bhij,ijd->bhid", probs, relative)
        return context.transpose(1, 2).reshape(b, s, self.heads * self.head_size)


class NezhaAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = NezhaSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, hidden_states, attention_mask=None):
        return self.output(self.self(hidden_states, attention_mask), hidden_states)


class NezhaLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = NezhaAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states, attention_mask=None):
        attended = self.attention(hidden_states, attention_mask)
        return self.output(self.intermediate(attended), attended)


class NezhaEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList(NezhaLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden_states, attention_mask=None):
        for layer in self.layer:
            hidden_states = layer(hidden_states, attention_mask)
        return hidden_states


class NezhaPreTrainedModel(PreTrainedModel):
    config_class = NezhaConfig
    config: NezhaConfig
    base_model_prefix = "nezha"

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BertLMPredictionHead):
            module.bias.zero_()


class NezhaModel(NezhaPreTrainedModel):
    def __init__(self, config, add_pooling_layer=True):
        super().__init__(config)
        self.embeddings = NezhaEmbeddings(config)
        self.encoder = NezhaEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **kwargs):
        x = self.embeddings(input_ids, token_type_ids)
        additive = None
        if attention_mask is not None:  # [b, s] of 1 (attend) / 0 -> [b, 1, 1, s] added to the scores
            additive = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        h = self.encoder(x, additive)
        return BaseModelOutputWithPooling(last_hidden_state=h,
                                          pooler_output=self.pooler(h) if self.pooler is not None else None)


class _WithMLMHead(NezhaPreTrainedModel):
    """A NEZHA body and BERT's MLM head (`cls.predictions`), whose decoder is the tied word embeddings."""
    _tied_weights_keys = {"cls.predictions.decoder.weight": "nezha.embeddings.word_embeddings.weight",
                          "cls.predictions.decoder.bias": "cls.predictions.bias"}

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new_embeddings):
        self.cls.predictions.decoder = new_embeddings
        self.cls.predictions.bias = new_embeddings.bias


class NezhaForPreTraining(_WithMLMHead):
    def __init__(self, config):
        super().__init__(config)
        self.nezha = NezhaModel(config)
        self.cls = BertPreTrainingHeads(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, next_sentence_label=None,
                **kwargs):
        out = self.nezha(input_ids, attention_mask, token_type_ids)
        prediction, relationship = self.cls(out.last_hidden_state, out.pooler_output)
        loss = None
        if labels is not None and next_sentence_label is not None:
            ce = nn.CrossEntropyLoss()
            loss = ce(prediction.view(-1, self.config.vocab_size), labels.view(-1)) + ce(relationship.view(-1, 2),
                                                                                          next_sentence_label.view(-1))
        return BertForPreTrainingOutput(loss=loss, prediction_logits=prediction, seq_relationship_logits=relationship)


class NezhaForMaskedLM(_WithMLMHead):
    def __init__(self, config):
        super().__init__(config)
        self.nezha = NezhaModel(config, add_pooling_layer=False)
        self.cls = BertOnlyMLMHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
        logits = self.cls(self.nezha(input_ids, attention_mask, token_type_ids).last_hidden_state)
        loss = None
        if labels is not None:
            loss = nn.CrossEntropyLoss()(logits.view(-1, self.config.vocab_size), labels.view(-1))
        return MaskedLMOutput(loss=loss, logits=logits)
