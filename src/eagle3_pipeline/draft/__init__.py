"""The EAGLE-3 draft: shape from the target (config), the model, the vocabulary map, training-time test,
token-budget data over the hidden-state shards, training and export."""
