"""How an embedding pools its tokens' hidden states: the values of a GGUF's `{arch}.pooling_type`
(llama.cpp's llama_pooling_type). A model may say which by a `pooling_type` attribute, and the
mean is the default. RANK: a cross-encoder (a Ranker) scores its pooled first token instead of
returning it; a causal Ranker pools its LAST token. Apart from ember.model, which needs torch,
so that the server reads them without it."""

POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK = 1, 2, 3, 4
