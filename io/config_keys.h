/* config_keys.h - every configuration key, declared once.
 *
 * X(section, key, type, default, help)
 *   type is INT, FLOAT, STR or a choice list written CHOICE("a|b|c").
 * This list generates struct config (field section_key), the defaults, the
 * INI handler, --set, --print-config, and the documentation check against
 * man/asyncpp.ini.5. To add a key: add a line here, document it in the man
 * page, and use cfg->section_key.
 */
#define CONFIG_KEYS(X)                                                                 \
	X(model, arch, CHOICE("llama|gpt2"), "llama", "architecture: llama (RMSNorm, RoPE, SwiGLU) or gpt2 (LayerNorm, GELU, learned positions)") \
	X(model, n_layer, INT, "4", "number of transformer blocks")                                    \
	X(model, d_model, INT, "128", "model width")                                                   \
	X(model, n_head, INT, "4", "attention heads")                                                  \
	X(model, n_kv_head, INT, "0", "key/value heads for grouped-query attention (llama); 0 means n_head") \
	X(model, d_ff, INT, "0", "feed-forward width; 0 means 4*d_model (gpt2) or about 8/3*d_model rounded to 64 (llama)") \
	X(model, seq_len, INT, "128", "context length T")                                              \
	X(model, vocab_size, INT, "0", "vocabulary size; 0 takes it from the data's tokenizer")        \
	X(model, tied, INT, "1", "1 ties the output head to the token embedding")                      \
	X(model, norm_eps, FLOAT, "1e-5", "epsilon of LayerNorm/RMSNorm")                              \
	X(model, rope_theta, FLOAT, "10000", "RoPE base (llama)")                                      \
	X(model, init_std, FLOAT, "0.02", "standard deviation of the initial weights")                 \
	X(data, train, STR, "", "training shards: a file, a directory or a glob; empty uses the built-in corpus") \
	X(data, val, STR, "", "validation shards, same forms as data.train")                           \
	X(data, tokenizer, STR, "", "tokenizer file used by sample and by the built-in corpus")        \
	X(train, steps, INT, "300", "optimizer steps to run")                                          \
	X(train, batch_size, INT, "8", "sequences per micro-batch (B)")                                \
	X(train, seed, INT, "1337", "seed for initialisation and data order")                          \
	X(train, device, CHOICE("cpu|cuda"), "cpu", "backend that runs the model")                     \
	X(train, threads, INT, "0", "CPU threads; 0 uses every core")                                  \
	X(train, schedule, CHOICE("none|gpipe|1f1b|2bw|pipedream"), "none", "pipeline schedule; none runs the stages in order on one worker") \
	X(train, delay, INT, "0", "emulated gradient delay in steps (one device)")                     \
	X(train, delay_mode, CHOICE("uniform|per-stage"), "uniform", "uniform: every layer sees train.delay; per-stage: layers of stage s see S-1-s (original PipeDream)") \
	X(train, grad_clip, FLOAT, "1.0", "clip the global gradient norm to this value; 0 disables")   \
	X(train, out_dir, STR, "runs/default", "directory for checkpoints and metrics")                \
	X(optim, name, CHOICE("adamw|muon|lion|sgd"), "adamw", "optimizer")                            \
	X(optim, lr, FLOAT, "3e-3", "peak learning rate")                                              \
	X(optim, min_lr_ratio, FLOAT, "0.1", "final learning rate as a fraction of optim.lr")         \
	X(optim, warmup, INT, "20", "linear warmup steps")                                             \
	X(optim, decay, CHOICE("cosine|linear|wsd|constant"), "cosine", "learning-rate decay after warmup") \
	X(optim, wsd_decay_frac, FLOAT, "0.2", "WSD: fraction of steps spent decaying at the end")    \
	X(optim, weight_decay, FLOAT, "0.1", "decoupled weight decay, applied to 2-D weights")         \
	X(optim, beta1, FLOAT, "0.9", "AdamW/Lion first-moment coefficient")                           \
	X(optim, beta2, FLOAT, "0.95", "AdamW/Lion second coefficient")                                \
	X(optim, eps, FLOAT, "1e-8", "AdamW epsilon")                                                  \
	X(optim, momentum, FLOAT, "0.95", "Muon and SGD momentum")                                     \
	X(optim, nesterov, INT, "1", "1 uses Nesterov momentum (Muon, SGD)")                           \
	X(optim, ns_steps, INT, "5", "Muon Newton-Schulz iterations")                                  \
	X(optim, muon_scale, CHOICE("rms|shape"), "rms", "Muon update scale: rms = 0.2*sqrt(max(rows,cols)), shape = sqrt(max(1,rows/cols))") \
	X(optim, correction, CHOICE("none|ef"), "none", "delay correction: ef is error feedback on the update") \
	X(optim, ef_lambda, FLOAT, "1.0", "error-feedback strength; 0 is no correction")               \
	X(optim, ef_groups, CHOICE("all|muon|adamw"), "all", "parameter groups the correction acts on") \
	X(pipeline, stages, INT, "1", "pipeline stages S")                                             \
	X(pipeline, micro_batches, INT, "1", "micro-batches per optimizer step M (gradient accumulation)") \
	X(pipeline, transport, CHOICE("local|mpi|nccl"), "local", "how stages exchange tensors")       \
	X(pipeline, data_parallel, INT, "1", "data-parallel replicas of the pipeline")                 \
	X(eval, every, INT, "100", "validation every N steps; 0 disables")                             \
	X(eval, batches, INT, "8", "validation micro-batches per evaluation")                          \
	X(log, every, INT, "10", "log every N steps")                                                  \
	X(log, metrics, STR, "", "metrics file; empty means OUT_DIR/metrics.csv (or metrics.jsonl with log.format = jsonl)")                      \
	X(log, format, CHOICE("csv|jsonl"), "csv", "metrics file format")                              \
	X(checkpoint, every, INT, "0", "checkpoint every N steps; 0 only at the end")                  \
	X(checkpoint, keep, INT, "3", "checkpoints to keep")
