"""The default models' code: digits (trained here from scikit-learn's digits) and minilm (sentence embeddings)."""
