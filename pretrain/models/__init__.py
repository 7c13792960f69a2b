"""Models: one transformer configured as BERT, GPT-2 or ERNIE (`model.Pretraining`)."""
