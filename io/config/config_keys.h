/* config_keys.h - every configuration key, declared once.
 *
 * X(section, key, type, default, help)
 *   type is INT_IN(lo, hi), FLOAT_IN(lo, hi) (inclusive bounds; INFINITY for
 *   none), STR or a choice list written CHOICE("a|b|c").
 * This list generates struct config (field section_key), the defaults, the
 * INI handler, --set, --print-config, and the documentation check against
 * man/asyncpp.ini.5. To add a key: add a line here, document it in the man
 * page, and use cfg->section_key.
 */
#define CONFIG_KEYS(X)                                                                 \
	X(model, arch, CHOICE("llama|gpt2"), "llama", "architecture: llama (RMSNorm, RoPE, SwiGLU) or gpt2 (LayerNorm, GELU, learned positions)") \
	X(model, n_layer, INT_IN(1, 4096), "4", "number of transformer blocks")                                    \
	X(model, d_model, INT_IN(1, 65536), "128", "model width")                                                   \
	X(model, n_head, INT_IN(1, 4096), "4", "attention heads")                                                  \
	X(model, n_kv_head, INT_IN(0, 4096), "0", "key/value heads for grouped-query attention (llama); 0 means n_head") \
	X(model, d_ff, INT_IN(0, 1048576), "0", "feed-forward width; 0 means 4*d_model (gpt2) or about 8/3*d_model rounded to 64 (llama)") \
	X(model, seq_len, INT_IN(1, 1048576), "128", "context length T")                                              \
	X(model, vocab_size, INT_IN(0, 16777216), "0", "vocabulary size; 0 takes it from the data's tokenizer")        \
	X(model, tied, INT_IN(0, 1), "1", "1 ties the output head to the token embedding")                      \
	X(model, norm_eps, FLOAT_IN(1e-12, 1), "1e-5", "epsilon of LayerNorm/RMSNorm")                              \
	X(model, rope_theta, FLOAT_IN(1, 1e12), "10000", "RoPE base (llama)")                                      \
	X(model, init_std, FLOAT_IN(0, 10), "0.02", "standard deviation of the initial weights")                 \
	X(model, n_expert, INT_IN(0, 4096), "0", "experts per layer (mixture of experts, llama); 0 is the dense model") \
	X(model, top_k, INT_IN(1, 4096), "2", "experts each token is routed to (at most model.n_expert)") \
	X(model, d_expert, INT_IN(0, 1048576), "0", "width of each expert's feed-forward; 0 means model.d_ff") \
	X(model, shared_expert, INT_IN(0, 1), "0", "1 adds a shared expert (width model.d_expert) that every token goes through") \
	X(model, router, CHOICE("softmax|sigmoid"), "softmax", "router scores: softmax over the experts, or per-expert sigmoid (DeepSeek-V3)") \
	X(model, aux_loss_coef, FLOAT_IN(0, INFINITY), "0.01", "coefficient of the load-balancing loss (Switch Transformer)") \
	X(model, z_loss_coef, FLOAT_IN(0, INFINITY), "0.001", "coefficient of the router z-loss (ST-MoE)") \
	X(model, expert_parallel, INT_IN(1, 4096), "1", "expert-parallel degree N: each MoE layer's experts split over N replicas of a data-parallel group (N divides model.n_expert and pipeline.data_parallel; a pipeline schedule; threads, mpi, tcp or nccl), the same bits as N = 1; bench plan costs it") \
	X(data, train, STR, "", "training shards: a file, a directory or a glob; empty uses the built-in corpus") \
	X(data, val, STR, "", "validation shards, same forms as data.train")                           \
	X(data, tokenizer, STR, "", "tokenizer file used by sample and by the built-in corpus")        \
	X(data, load, CHOICE("auto|memory|stream"), "auto", "memory reads every token at start; stream reads windows from the shards as needed; auto streams above 4 GiB of tokens") \
	X(train, steps, INT_IN(0, INFINITY), "300", "optimizer steps to run")                                          \
	X(train, batch_size, INT_IN(1, 1048576), "8", "sequences per micro-batch (B)")                                \
	X(train, seed, INT_IN(0, INFINITY), "1337", "seed for initialisation and data order")                          \
	X(train, device, CHOICE("cpu|cuda|cuda:N"), "cpu", "backend that runs the model: cpu, cuda (the GPU of the local rank) or cuda:N")                     \
	X(train, threads, INT_IN(0, 4096), "0", "CPU threads; 0 uses every core")                                  \
	X(train, act_dtype, CHOICE("auto|f32|bf16"), "auto", "storage of activations and their gradients: f32, bf16 (rounded to nearest even on every store), or auto (bf16 on cuda, f32 on cpu); weights, gradients and optimizer state stay f32") \
	X(train, schedule, CHOICE("none|gpipe|1f1b|2bw|pipedream|interleaved|zb-h1|zb-v|2bw-zb"), "none", "pipeline schedule; none runs the stages in order on one worker; interleaved, zb-h1, zb-v and 2bw-zb are drawn and simulated by bench schedule, not yet trained") \
	X(train, delay, INT_IN(0, 64), "0", "emulated gradient delay in steps (one device)")                     \
	X(train, delay_mode, CHOICE("uniform|per-stage"), "uniform", "uniform: every layer sees train.delay; per-stage: layers of stage s see S-1-s (original PipeDream)") \
	X(train, grad_clip, FLOAT_IN(0, INFINITY), "1.0", "clip the global gradient norm to this value; 0 disables")   \
	X(train, max_skipped, INT_IN(1, 1000000), "5", "stop (train.on_divergence) after this many steps in a row whose update was skipped (gradient norm NaN or infinite) or whose loss was not finite") \
	X(train, spike_factor, FLOAT_IN(0, INFINITY), "10", "a loss above this multiple of the mean of the last train.spike_window good steps' losses is a divergence; 0 disables") \
	X(train, spike_window, INT_IN(1, 1000000), "20", "good steps whose losses make the mean a spike is measured against; no spike test before this many") \
	X(train, on_divergence, CHOICE("stop|rollback"), "stop", "on a loss spike or train.max_skipped skipped steps in a row: stop, or roll back to the newest checkpoint from before it, skip the data since and lower the learning rate") \
	X(train, rollback_lr_factor, FLOAT_IN(0, 1), "0.5", "train.on_divergence = rollback: the learning rate is multiplied by this at each rollback") \
	X(train, max_rollbacks, INT_IN(0, 1000000), "4", "train.on_divergence = rollback: rollbacks a run may make before it stops as with stop") \
	X(train, out_dir, STR, "runs/default", "directory for checkpoints and metrics")                \
	X(optim, name, CHOICE("adamw|muon|lion|sgd|adan|mars|ademamix|soap|normuon"), "adamw", "optimizer; its paper's values become the defaults of the betas and weight_decay (asyncpp-train(1))") \
	X(optim, lr, FLOAT_IN(0, INFINITY), "3e-3", "peak learning rate")                                              \
	X(optim, min_lr_ratio, FLOAT_IN(0, 1), "0.1", "final learning rate as a fraction of optim.lr")         \
	X(optim, warmup, INT_IN(0, INFINITY), "20", "linear warmup steps")                                             \
	X(optim, decay, CHOICE("cosine|linear|wsd|constant"), "cosine", "learning-rate decay after warmup") \
	X(optim, wsd_decay_frac, FLOAT_IN(0, 1), "0.2", "WSD: fraction of steps spent decaying at the end")    \
	X(optim, weight_decay, FLOAT_IN(0, INFINITY), "0.1", "decoupled weight decay, applied to 2-D weights; the default follows optim.name")         \
	X(optim, beta1, FLOAT_IN(0, 1), "0.9", "first-moment coefficient (AdamW, Lion, Adan, ...); the default follows optim.name")                           \
	X(optim, beta2, FLOAT_IN(0, 1), "0.95", "second coefficient (AdamW, Lion, Adan, ...); the default follows optim.name")                                \
	X(optim, beta3, FLOAT_IN(0, 1), "0.99", "third coefficient (Adan's squared-gradient average); the default follows optim.name") \
	X(optim, mars_gamma, FLOAT_IN(0, INFINITY), "0.025", "MARS: weight of the gradient-difference correction") \
	X(optim, ademamix_alpha, FLOAT_IN(0, INFINITY), "5", "AdEMAMix: weight of the slow average") \
	X(optim, ademamix_warmup, INT_IN(0, INFINITY), "0", "AdEMAMix: steps over which alpha and beta3 warm up; 0 means train.steps") \
	X(optim, soap_every, INT_IN(1, INFINITY), "10", "SOAP: steps between refreshes of the eigenbases") \
	X(optim, eps, FLOAT_IN(0, 1), "1e-8", "AdamW epsilon")                                                  \
	X(optim, momentum, FLOAT_IN(0, 1), "0.95", "Muon, NorMuon and SGD momentum")                                     \
	X(optim, nesterov, INT_IN(0, 1), "1", "1 uses Nesterov momentum (Muon, NorMuon, SGD)")                           \
	X(optim, ns_steps, INT_IN(0, 100), "5", "Muon and NorMuon Newton-Schulz iterations")                                  \
	X(optim, muon_scale, CHOICE("rms|shape"), "rms", "Muon and NorMuon update scale: rms gives an update RMS of about 0.2*lr (like AdamW), shape the authors' sqrt(max(1,rows/cols)) (asyncpp-train(1))") \
	X(optim, correction, CHOICE("none|ef|predict"), "none", "delay correction: ef is error feedback on the update, predict runs the gradient on weights extrapolated by the delay") \
	X(optim, ef_lambda, FLOAT_IN(-10, 10), "1.0", "error-feedback strength; 0 is no correction")               \
	X(optim, ef_groups, CHOICE("all|muon|adamw"), "all", "parameter groups the correction acts on") \
	X(pipeline, stages, INT_IN(1, 4096), "1", "pipeline stages S")                                             \
	X(pipeline, split, CHOICE("even|balanced|layers"), "balanced", "how layers are assigned to stages: balanced (minimise the largest stage's modelled FLOPs, head and embeddings included), even (L/S each, the first stages one more) or layers (pipeline.layers)") \
	X(pipeline, layers, STR, "", "with pipeline.split = layers: layers per stage, e.g. 3,4,4,2 (summing to model.n_layer; only the first and last stage may have 0)") \
	X(pipeline, micro_batches, INT_IN(1, 1048576), "1", "micro-batches per optimizer step M (gradient accumulation)") \
	X(pipeline, virtual_stages, INT_IN(1, 64), "1", "with train.schedule = interleaved: model chunks per stage V (Megatron's virtual stages); 1 is the plain 1f1b layout") \
	X(pipeline, transport, CHOICE("local|mpi|tcp|nccl"), "local", "how stages exchange tensors")       \
	X(pipeline, timeout, FLOAT_IN(0, INFINITY), "600", "seconds a stage process waits for a tensor before it names it and aborts the job (mpi, tcp, nccl; 0 waits forever)") \
	X(pipeline, devices, STR, "", "with pipeline.transport = local and a schedule: the GPU of each stage, e.g. cuda:0,cuda:1,cuda:2,cuda:3 (one entry per stage; a GPU may repeat, its stages then run on streams of their own); empty: every stage on train.device, one stream") \
	X(pipeline, bucket_mb, FLOAT_IN(0, INFINITY), "25", "MiB of gradient per bucket of the replicas' sum, started as the step's last backward finishes layers (overlapping it under pipeline.transport = nccl; threads sum each bucket at once; mpi and tcp sum once); 0: one sum after the backward. The bits do not depend on it") \
	X(pipeline, data_parallel, INT_IN(1, 4096), "1", "data-parallel replicas of the pipeline")                 \
	X(eval, every, INT_IN(0, INFINITY), "100", "validation every N steps; 0 disables")                             \
	X(eval, batches, INT_IN(1, 1048576), "8", "validation micro-batches per evaluation")                          \
	X(sample, every, INT_IN(0, INFINITY), "0", "write a sample of the model's text every N steps to OUT_DIR/samples.txt; 0: never") \
	X(sample, prompt, STR, "The", "the text each sample continues")                                      \
	X(sample, tokens, INT_IN(1, 4096), "48", "tokens per sample (fewer when the model ends the text)")          \
	X(log, every, INT_IN(1, INFINITY), "10", "log every N steps")                                                  \
	X(log, metrics, STR, "", "metrics file; empty means OUT_DIR/metrics.csv (or metrics.jsonl with log.format = jsonl)")                      \
	X(log, format, CHOICE("csv|jsonl"), "csv", "metrics file format")                              \
	X(log, tensorboard, STR, "", "directory for TensorBoard event files (the metrics as scalars); empty: none") \
	X(checkpoint, every, INT_IN(0, INFINITY), "0", "checkpoint every N steps; 0 only at the end")                  \
	X(checkpoint, every_minutes, FLOAT_IN(0, INFINITY), "30", "also checkpoint when this many minutes passed since the last checkpoint; 0: only checkpoint.every") \
	X(checkpoint, keep, INT_IN(1, 1048576), "3", "checkpoints to keep")

/* Defaults that follow optim.name: Y(optimizer, section, key, value) gives
 * section.key the optimizer's published default when neither a file, --set
 * nor a checkpoint set the key (config_finish applies them; a checkpoint's
 * configuration sets every key, so a resume keeps what the run used). */
#define CONFIG_OPTIM_DEFAULTS(Y)                  \
	Y("adan", optim, beta1, "0.98")           \
	Y("adan", optim, beta2, "0.92")           \
	Y("adan", optim, beta3, "0.99")           \
	Y("adan", optim, weight_decay, "0.02")    \
	Y("mars", optim, beta1, "0.95")           \
	Y("mars", optim, beta2, "0.99")           \
	Y("ademamix", optim, beta1, "0.9")        \
	Y("ademamix", optim, beta2, "0.999")      \
	Y("ademamix", optim, beta3, "0.9999")     \
	Y("soap", optim, beta1, "0.95")           \
	Y("soap", optim, beta2, "0.95")           \
	Y("soap", optim, weight_decay, "0.01")
