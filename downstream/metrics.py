"""Downstream metrics, computed locally: scikit-learn (accuracy, F1, Matthews correlation), scipy (Pearson,
Spearman), seqeval (entity-level F1 of BIO tags), and SQuAD v1.1's exact match and F1 (its answer normalisation;
Chinese text is compared character by character, as CMRC 2018's script does). Scores are fractions in [0, 1]
(correlations in [-1, 1])."""
from __future__ import annotations

import collections
import re
import string

FOR_KIND = {"classification": ("accuracy", "f1", "macro_f1", "mcc"), "regression": ("pearson", "spearman"),
            "tagging": ("f1", "precision", "recall", "accuracy"), "qa": ("f1", "exact_match")}


def classification(gold: list[str], pred: list[str], labels: list[str], names: list[str]) -> dict[str, float]:
    """`f1`: of the second label for two classes (GLUE's MRPC and QQP: the positive class), macro otherwise."""
    from sklearn import metrics as skm

    binary = len(labels) == 2
    f1 = {"pos_label": labels[-1], "average": "binary"} if binary else {"average": "macro"}
    out = {"accuracy": skm.accuracy_score(gold, pred),
           "f1": skm.f1_score(gold, pred, labels=labels, zero_division=0, **f1),
           "macro_f1": skm.f1_score(gold, pred, labels=labels, average="macro", zero_division=0),
           "mcc": skm.matthews_corrcoef(gold, pred)}
    return {k: float(out[k]) for k in names}


def regression(gold: list[float], pred: list[float], names: list[str]) -> dict[str, float]:
    """Pearson and Spearman correlations (0 where the predictions are constant: no correlation is defined)."""
    import numpy as np
    from scipy import stats

    if np.std(pred) == 0 or np.std(gold) == 0:
        return {k: 0.0 for k in names}
    out = {"pearson": stats.pearsonr(gold, pred)[0], "spearman": stats.spearmanr(gold, pred)[0]}
    return {k: float(out[k]) for k in names}


def tagging(gold: list[list[str]], pred: list[list[str]], names: list[str]) -> dict[str, float]:
    """seqeval's entity-level scores (CoNLL's: an entity counts when its type and both ends are right)."""
    from seqeval import metrics as sm

    out = {"f1": sm.f1_score(gold, pred, zero_division=0), "precision": sm.precision_score(gold, pred, zero_division=0),
           "recall": sm.recall_score(gold, pred, zero_division=0), "accuracy": sm.accuracy_score(gold, pred)}
    return {k: float(out[k]) for k in names}


_CJK = re.compile(r"([\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef])")
_PUNCT = set(string.punctuation) | set("，。、；：？！“”‘’《》（）【】…—·")


def answer_tokens(text: str) -> list[str]:
    """SQuAD's normalisation (lower case, no punctuation, no articles a/an/the, single spaces), then its words,
    each CJK character a word of its own."""
    text = "".join(c for c in text.lower() if c not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return _CJK.sub(r" \1 ", text).split()


def qa(golds: list[list[str]], preds: list[str], names: list[str]) -> dict[str, float]:
    """SQuAD v1.1: each prediction's best exact match and token F1 over its gold answers, averaged."""
    em = f1 = 0.0
    for answers, pred in zip(golds, preds):
        p = answer_tokens(pred)
        em += max(float(answer_tokens(a) == p) for a in answers)
        f1 += max(_token_f1(answer_tokens(a), p) for a in answers)
    n = max(len(preds), 1)
    out = {"exact_match": em / n, "f1": f1 / n}
    return {k: out[k] for k in names}


def _token_f1(gold: list[str], pred: list[str]) -> float:
    common = sum((collections.Counter(gold) & collections.Counter(pred)).values())
    if not gold or not pred:
        return float(gold == pred)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)
