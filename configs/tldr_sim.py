"""The simulated TL;DR world on this CPU: the quickstart.

  python -m rlhfjax.main --config configs/tldr_sim.py --workdir runs/tldr_sim   # SFT -> label -> RM
  python -m rlhfjax.main --config configs/tldr_sim.py --workdir runs/tldr_sim --config.task=rm
  python -m rlhfjax.main --config configs/tldr_sim.py:tiny --workdir /tmp/t   # seconds, for tests
  python -m rlhfjax.main --config configs/tldr_sim.py --workdir runs/tldr_sim_seeds \\
      --config.task=seeds --config.seeds.run_seeds=0,1,2   # stages per seed; mean ± sd per method

Every knob has a default that works on a 2-core CPU; accelerator configs override sizes.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # `pipeline` runs `stages` in order, each resuming or reusing what the workdir already holds;
  # any single stage can run alone with --config.task=<stage>.
  c.task = "pipeline"
  c.stages = "sft,label,rm,ppo,best_of_n,expert_iteration,eval"
  c.seed = 0
  c.workdir = "runs/tldr_sim"

  # Devices: the Mesh's axes (one may be -1: the devices left) — data parallel, fully sharded data
  # parallel (parameters and optimizer state split), tensor parallel. See docs/scaling.md.
  # auto: try the shapes of a TPU slice and take the fitting one with the best estimated step
  # time (task=compile, launch/tpu_pod.py; docs/tpu.md).
  c.mesh = dict(data=-1, fsdp=1, tensor=1, auto=False)
  # Several processes (hosts): 'auto' starts jax.distributed on TPU pods, SLURM job steps or with
  # JAX_COORDINATOR_ADDRESS set; 'explicit' uses the three keys below (launch/multiprocess.py); 'off'.
  c.distributed = dict(mode="auto", coordinator_address="", num_processes=1, process_id=0,
                       initialization_timeout=300)
  # How JAX computes (rlhfjax/runtime.py; set before the backend starts). matmul_precision 'auto':
  # 'highest' for float32 models (float32 matmuls are TF32 on GPUs, bf16 passes on TPUs otherwise),
  # JAX's 'default' for bf16 ones. deterministic: XLA's deterministic GPU reductions and scatters,
  # so a resumed run equals an uninterrupted one; False is the fast setting for bf16 GPU training.
  # host_malloc 'auto': where JAX computes on the CPU, glibc keeps each step's freed scratch buffer
  # for the next step instead of unmapping it (about 15% faster steps here, a larger resident set);
  # 'system' leaves glibc's defaults.
  c.runtime = dict(matmul_precision="auto", deterministic=True, host_malloc="auto")

  # Data: the procedurally generated TL;DR world, AlpacaFarm-style splits (sizes in examples).
  # reference_noise scales how often human references miss or add a detail (0: ideal references).
  c.data = dict(source="sim_tldr", seed=0, sft=12000, pref=8000, unlabeled=8000, validation=512,
                test=512, reference_noise=1.0)

  # SentencePiece, trained on the SFT split's text unless `path` names a `.model` file. Pieces may
  # mix digits and letters, so age tags like "(24F)" are single tokens that copy in one step.
  c.tokenizer = dict(path="", vocab_size=1536, model_type="bpe", train_examples=4000,
                     split_by_unicode_script=False)

  # Token budgets: the post is truncated at sentence boundaries to fit `prompt_len`.
  c.format = dict(prompt_len=128, response_len=48)

  # Rollouts (rlhfjax/parallel/rollout.py): every method that samples copies the policy once per
  # rollout into a layout of its own. mesh: 'auto' (CPU: every device a replica; accelerators:
  # tensor parallel over one host's devices, replicas over hosts, widened until it fits beside the
  # training state), 'train' (the trainer's layout and weights) or e.g. 'data=-1,tensor=4';
  # dtype: 'auto' (model.dtype, the compute dtype) or a dtype name. Decoding ends when every row
  # has its eos (early_stop) and reads the KV cache in blocks of cache_block tokens, each step only
  # up to its block's end (0: every slot at every step).
  # placement (rlhfjax/parallel/placement.py): 'colocated' (sampler and trainer take turns on every
  # device) or 'split' (the last sampler_share of the devices sample while the others train; the
  # policy is pushed to them after each update). max_staleness: the online methods train on a
  # batch at most that many policy versions old, generated while the trainer updates (0: sampled
  # from the policy it trains, synchronous; asynchronous rollouts, docs/scaling.md).
  c.rollout = dict(mesh="auto", dtype="auto", early_stop=True, cache_block=128,
                   placement="colocated", sampler_share=0.25, max_staleness=0)
  # The online methods' reward (rlhfjax/rollout/reward_functions.py): reward functions, each
  # 'module:function' or 'file.py:function', comma-separated, with their weights ('' = all 1.0),
  # plus model_weight times the reward model's score (0: functions alone, no reward model).
  c.reward = dict(functions="", weights="", model_weight=1.0)

  # The decoder (see rlhfjax/models/config.py for the meaning of each key).
  c.model = dict(variant="gpt2", vocab_size=c.tokenizer.get_ref("vocab_size"), d_model=128,
                 n_layers=2, n_heads=4, n_kv_heads=4, d_ff=512, max_len=192, head_dim=0,
                 tie_embeddings=True, norm_eps=1e-5, rope_theta=10000.0, dropout=0.0,
                 dtype="float32", param_dtype="float32", remat="none", scan_layers=False,
                 attention="reference", attention_chunk=512)

  # Rematerialisation of each trained model (roles as in `lora` below; with
  # ppo.value_model='policy_trunk' the value head rides on the policy's): none | full (keep each
  # layer's input, recompute the layer in the backward pass) | dots (keep the projection and MLP
  # matmul outputs too, recompute the rest) | offload (those outputs in pinned host memory);
  # '' takes model.remat. Memory and speed; results equal up to rounding (a recomputed forward may
  # round differently), so a resumed run may switch it (then not bit-identical to an uninterrupted
  # one); task=memory shows what each costs.
  c.remat = dict(sft="", rm="", policy="", value="")

  # Supervised fine-tuning on the reference summaries (loss on summary tokens only). 1,600 steps
  # (about 4 epochs of the SFT split): the validation loss stops falling there; at 800 it was still
  # falling, and that model's wrong facts and disfluencies decided the reward model's hardest pairs
  # (docs/research/world_v2.md, "Training the SFT model to its plateau").
  # Every training block's skip_nonfinite: 0 stops the run at the first non-finite loss or gradient
  # norm (before saving it); N > 0 drops such updates and counts them, stopping after N in a row.
  c.sft = dict(batch_size=32, steps=1600, lr=6e-3, warmup_steps=30, schedule="cosine",
               end_lr_frac=0.1, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
               skip_nonfinite=0, log_every=25, eval_every=100, eval_batches=4)

  # Evaluation on the first num_examples test posts: every method answers at `temperature` (0.7,
  # as AlpacaFarm decodes; 0: greedy); task=eval judges `methods` against `against` (the human
  # 'reference' summaries, or another method's answers, e.g. 'sft') with `annotator` (the
  # evaluation pool; 'rm' on real data, which has no simulated annotators) and plots the
  # over-optimisation curves (compare_runs: other workdirs whose PPO and best-of-N curves join the
  # plot, e.g. a beta sweep or noiseless labels). On a verifiable task (configs/verifiable.py)
  # pass_k > 0 samples each test prompt pass_k times at pass_temperature and marks each sample with
  # the reward function `correct` ('module:function', 1.0 = right) for task=pass_at_k.
  c.eval = dict(num_examples=256, batch_size=64, show=3, temperature=0.7, top_k=0, top_p=1.0,
                methods="sft,ppo,best_of_n,expert_iteration", against="reference",
                compare_runs="", annotator="eval_pool", pass_k=0, pass_temperature=1.0,
                correct="")

  # Simulated annotators (AlpacaFarm-style pool for the simulated world): each member's traits are
  # drawn uniformly from these (low, high) ranges. Utility = weights . gold components + length_bias
  # per word; P(first shown wins) = sigmoid(du / temperature + position_bias). Training labels are
  # flipped with probability flip_rate; the evaluation pool is the same members without flips.
  c.annotators = dict(pool_size=8, seed=0, flip_rate=0.25, file_layout="openai", traits=dict(
      weight_coverage=(0.6, 1.4), weight_accuracy=(0.6, 1.4), weight_conciseness=(0.3, 1.5),
      weight_fluency=(0.5, 1.5), length_bias=(0.0, 0.02), position_bias=(-0.5, 0.5),
      temperature=(0.05, 0.15)))

  # Preference data: SFT sample pairs at `temperature` (0.7, Stiennon et al.'s; at 1.0 the SFT
  # model's own disfluent samples let its likelihood judge as well as a reward model:
  # docs/research/world_v2.md) on the PREF split (training) and the validation split (held out),
  # compared by `annotator` (train_pool | eval_pool | single | gold | rm | file:PATH); or, with
  # `comparisons` naming a TFDS comparisons dataset (openai_comparisons), human comparisons copied
  # from it instead. protocol: 'pairs' (the comparisons above, train.jsonl and valid.jsonl) |
  # 'binary' (thumbs up or down for KTO: one sample per post, num_pairs and num_val_pairs posts,
  # desirable when `annotator` prefers it to the post's reference summary; binary_train.jsonl and
  # binary_valid.jsonl in the binary layout, beside the pairs).
  c.label = dict(annotator="train_pool", num_pairs=4000, num_val_pairs=512, temperature=0.7,
                 top_k=0, top_p=1.0, batch_size=64, report_draws=4, comparisons="",
                 protocol="pairs")

  # Human labels from the labeling site (tasks label_load, label_user, label_server, label_export;
  # docs/labeling.md). protocol: stiennon (9-point preference + 1-7 ratings of each summary) |
  # alpacafarm (A / B / tie) | turing_advice. source: pairs to load (methods:A,B | outputs:PATH_A,
  # PATH_B | comparisons:PATH, ';' between several), gold_file: comparisons with known answers,
  # both in `layout`, the layout exports are written in. Each pair goes to labels_per_pair distinct
  # labelers; an assignment left open lease_minutes returns to the queue; one assignment in
  # gold_every (at random) is a gold pair; the export leaves out labelers below
  # min_gold_agreement on min_gold_labels or more of them. db '': <workdir>/labeling/labels.db;
  # export_dir '': <workdir>/labeling/export; url: the site's public address ('': host:port);
  # guidelines: a Markdown file for the guidelines page ('': the protocol's own, shipped in
  # rlhfjax/labeling/guidelines/); goal: the labels each labeler is asked for, shown beside their
  # count (0: none; their share of all labels is shown either way). user: task=label_user's new
  # labeler (revoke: the one whose access it ends instead); cookie_name: the session cookie's ('':
  # rlhfjax_session_<port>, so two sites on one host keep their sessions apart).
  c.labeling = dict(db="", protocol="stiennon", source="methods:sft,ppo", gold_file="",
                    layout="openai", labels_per_pair=3, lease_minutes=30, gold_every=10,
                    min_gold_agreement=0.6, min_gold_labels=5, valid_fraction=0.1, seed=0,
                    host="127.0.0.1", port=8080, url="", user="", admin=False, token_hours=72,
                    session_hours=12, login_attempts_per_minute=10, export_dir="",
                    guidelines="", goal=0, revoke="", cookie_name="")

  # Reward model: Bradley-Terry from the SFT checkpoint, one epoch; then scores are normalised so
  # that `normalize` ('reference' summaries | 'sft' samples | 'none') has mean 0 (and std 1 with
  # normalize_std). Comparison files default to task=label's output. likelihood_weight: the score
  # adds this (learned) weight times the response's mean token log-probability under the model's
  # own LM head; head_init_scale multiplies the head's initial kernel (std 1/sqrt(d_model + 1)).
  # Stiennon et al.'s model is likelihood_weight=0, head_init_scale=1. The 2-layer model here needs
  # the likelihood: its head alone learns length, not fact-checking; and a zero head lets it start
  # as the SFT likelihood judge instead of that plus a random head (docs/reward_model.md). Both
  # values were chosen on the evaluation pool's labels (weights 1, 2, 3, 5; scales 0, 1).
  # contrast_batch_size > 0 adds that many label-free pairs per step (preference-model
  # pretraining: a `contrast_split` reference over a copy with one fact swapped or substituted,
  # rlhfjax/feedback/contrast.py) at loss weight contrast_weight; off: measured not to help here.
  c.rm = dict(train_file="", valid_file="", layout="openai", batch_size=32, epochs=1.0, lr=3e-4,
              warmup_steps=10, schedule="cosine", end_lr_frac=0.1, b1=0.9, b2=0.95, eps=1e-8,
              weight_decay=0.0, grad_clip=1.0, skip_nonfinite=0, log_every=10, eval_every=50,
              eval_batch_size=64, normalize="reference", normalize_std=False, norm_examples=512,
              probe_examples=256, bootstrap=200, likelihood_weight=3.0, head_init_scale=0.0,
              contrast_batch_size=0, contrast_weight=1.0, contrast_split="sft", contrast_max_df=0.2)

  # PPO against the reward model (Ziegler et al. / Stiennon et al.; knobs named as in TRL where
  # they exist). Per-token reward -kl_coef * (log pi - log pi_ref), plus the RM score at eos, or
  # no_eos_score for a response that never ends (penalize_no_eos). adaptive_kl: Ziegler's
  # controller towards kl_target nats over kl_horizon episodes. GAE with gamma, lam; advantages
  # whitened over the 'batch' (AlpacaFarm) or per 'minibatch'. Learning rate linear to 0.
  # frozen_dtype: the reference and reward models' dtype ('' keeps model.param_dtype; 'bfloat16'
  # halves their memory: they are never trained, so they need no float32 master copy; use it with
  # model.dtype='bfloat16', where the reference then equals the initial policy exactly).
  # value_model: 'separate' (own backbone, from the RM) | 'policy_trunk' (RM head on policy states).
  c.ppo = dict(steps=60, rollout_batch=64, minibatch_size=16, epochs=2, temperature=1.0,
               kl_coef=0.05, adaptive_kl=False, kl_target=6.0, kl_horizon=10000.0,
               gamma=1.0, lam=0.95, whiten="batch", cliprange=0.2, cliprange_value=0.2,
               vf_coef=0.1, penalize_no_eos=True, no_eos_score=-1.0, frozen_dtype="",
               value_model="separate",
               # truncated_is: weight each token's surrogate term by min(pi_old / pi_sampler,
               # tis_cap), TIS (Yao et al. 2025), against the sampler's numerics and staleness.
               # old_policy: the ratio's pi_old, 'recompute' (the trainer's log-probs of the
               # policy before this update; TRL, verl) or 'sampler' (the sampler's own log-probs,
               # the behaviour policy: with rollout.max_staleness, the stale policy's).
               truncated_is=False, tis_cap=2.0, old_policy="recompute",
               lr=3e-4, warmup_steps=0, schedule="linear", end_lr_frac=0.0, b1=0.9, b2=0.95,
               eps=1e-5, weight_decay=0.0, grad_clip=1.0, skip_nonfinite=0,
               log_every=1, eval_every=10, eval_examples=256)

  # The critic-free online methods, at PPO's label and compute budget (the same reward model,
  # steps x rollout_batch = 3,840 episodes, AdamW at PPO's settings); each samples k responses per
  # prompt (rollout_batch / k prompts an iteration) and scores them like PPO (penalize_no_eos).
  # share_prompt: every forward (policy, reference, reward model, update) computes each prompt once
  # for its k samples, and minibatches hold whole groups (False: rows shuffled and computed alone).
  online = dict(steps=60, rollout_batch=64, temperature=1.0, penalize_no_eos=True,
                no_eos_score=-1.0, share_prompt=True,
                # truncated_is, old_policy (rloo, grpo): as ppo's; online DPO refuses them
                # (its loss has no ratio).
                truncated_is=False, tis_cap=2.0, old_policy="recompute",
                lr=3e-4, warmup_steps=0,
                schedule="linear", end_lr_frac=0.0, b1=0.9, b2=0.95, eps=1e-5, weight_decay=0.0,
                grad_clip=1.0, skip_nonfinite=0, log_every=1, eval_every=10, eval_examples=256)
  # RLOO (Ahmadian et al.; TRL's defaults k=2, kl_coef 0.05 as sequence KL in the reward, clipped
  # sequence ratio with cliprange 0.2; TRL runs 4 epochs, here PPO's 2 x minibatch 16).
  c.rloo = dict(online, k=2, kl_coef=0.05, cliprange=0.2, epochs=2, minibatch_size=16,
                normalize_advantages=False)
  # GRPO (Shao et al.: beta 0.04 with the k3 KL in the loss, cliprange 0.2, rewards normalised
  # per group, loss_type 'grpo' = per-sequence token means; k 8 as TRL's num_generations).
  # scale_rewards: group | batch | none; loss_type: grpo | bnpo | dr_grpo; kl_estimator: k3 | k1;
  # kl_in: loss | reward (k1 in the loss with beta > 0 is refused: its gradient is zero in
  # expectation).
  # DAPO (Yu et al. 2025; each part off here, DAPO's value in brackets): cliprange is the lower
  # clip eps_low [0.2], cliprange_high the upper eps_high [0.28]; loss_type 'bnpo' is its token-
  # level loss; overlong_buffer: the last L_cache tokens before response_len, over which the
  # reward falls linearly to -overlong_penalty_factor [4096 of 20480 tokens; 1.0] (0: off; with
  # penalize_no_eos a response without eos keeps no_eos_score, no penalty on top);
  # dynamic_sampling: groups whose dynamic_sampling_metric is all equal leave the loss [on]; the
  # metric 'score' tests the scores before overlong shaping and KL (DAPO's accuracy, verl's
  # filter_groups.metric=acc) ['score'], 'reward' the rewards the advantages use;
  # max_num_gen_batches: with dynamic sampling, the loop refills the batch with groups of new prompts, drawing up to
  # that many generation batches an iteration [10] (1: no refill); DAPO drops the KL [beta 0].
  # GSPO (Zheng et al. 2025): importance_sampling_level token (GRPO) | sequence (one ratio per
  # response, the geometric mean of its token ratios [cliprange 3e-4, cliprange_high 4e-4,
  # beta 0]) | sequence_token (GSPO-token: that value, each token's own gradient).
  c.grpo = dict(online, k=8, beta=0.04, kl_estimator="k3", kl_in="loss", cliprange=0.2,
                cliprange_high=0.2, scale_rewards="group", loss_type="grpo", epochs=2,
                minibatch_size=16, overlong_buffer=0, overlong_penalty_factor=1.0,
                dynamic_sampling=False, dynamic_sampling_metric="score", max_num_gen_batches=1,
                importance_sampling_level="token")
  # dapo, gspo and dr_grpo below are blocks of their own, each complete (every knob the GRPO step
  # reads; the code has no defaults for them): copies of grpo's values as this file sets them, with
  # each paper's settings on top. A run reads its task's block alone, so --config.grpo.lr=...
  # changes task=grpo only and --config.dapo.lr=... task=dapo only (likewise gspo, dr_grpo); to
  # change a knob for several of them, set it in each block.
  # task=dapo: the GRPO step under DAPO's settings (verl's recipe): Clip-Higher (0.2, 0.28), the
  # token-level loss, overlong shaping over the last fifth of response_len (4096 of 20480 tokens),
  # dynamic sampling refilled from new prompts in up to 10 generation batches, no KL term.
  c.dapo = dict(c.grpo, cliprange_high=0.28, loss_type="bnpo",
                overlong_buffer=c.format.get_ref("response_len") // 5, dynamic_sampling=True,
                max_num_gen_batches=10, beta=0.0)
  # task=gspo: the GRPO step with GSPO's sequence-level ratio and the paper's clip range
  # (3e-4, 4e-4), no KL term, the per-sequence mean ('grpo'); GRPO's epochs and minibatches.
  c.gspo = dict(c.grpo, importance_sampling_level="sequence", cliprange=3e-4,
                cliprange_high=4e-4, beta=0.0)
  # task=dr_grpo: Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"), the GRPO step
  # with neither the std division of the advantage nor each response's length as the normaliser
  # (a constant, sequences x response_len), and no KL term (the authors' runs: beta 0).
  c.dr_grpo = dict(c.grpo, loss_type="dr_grpo", scale_rewards="none", beta=0.0)
  # REINFORCE++ (Hu et al. 2025; OpenRLHF's defaults): PPO's per-token reward (-kl_coef x the k1
  # KL on every token, the score on the last) without a critic; the return is the reward-to-go
  # (gamma) and the advantage that return whitened over every real token of the rollout batch
  # (global, not per prompt); PPO's clipped token-level surrogate, cliprange 0.2.
  # advantage_estimator: reinforce_pp (k >= 1; OpenRLHF's `reinforce`, 1 sample per prompt) |
  # reinforce_pp_baseline (OpenRLHF's `reinforce_baseline`: each prompt's mean score subtracted
  # first; needs k >= 2 and gamma 1). kl_coef 0.01: OpenRLHF's init_kl_coef.
  c.reinforce_pp = dict(online, k=1, advantage_estimator="reinforce_pp", kl_coef=0.01, gamma=1.0,
                        cliprange=0.2, epochs=2, minibatch_size=16)
  # Online DPO (Guo et al.; TRL's beta 0.1, sigmoid loss): two fresh samples per prompt, judged by
  # the reward model ('rm') or an annotator (train_pool, eval_pool, single, gold, file:PATH), then
  # one DPO step per iteration against the SFT reference (lr as offline DPO's).
  c.online_dpo = dict(online, judge="rm", beta=0.1, loss_type="sigmoid", label_smoothing=0.0,
                      lr=1e-4)

  # Best-of-N: n SFT samples at `temperature` (by default the evaluation's, so best-of-1 is the SFT
  # row of the leaderboard), the RM picks; the curve covers n = 1, 2, 4, ..., n.
  c.best_of_n = dict(n=16, temperature=c.eval.get_ref("temperature"), batch_size=256)

  # Expert iteration: best-of-n (RM) on num_prompts unlabeled posts, then SFT from the SFT policy on
  # the winners with these optimiser settings.
  c.expert_iteration = dict(n=8, num_prompts=512, temperature=1.0, sample_batch_size=256,
                            batch_size=32, steps=32, lr=1e-3, warmup_steps=0, schedule="cosine",
                            end_lr_frac=0.1, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0,
                            grad_clip=1.0, skip_nonfinite=0, log_every=8, eval_every=16,
                            eval_batches=4)

  # Binary FeedME (SFT on the preferred responses) and binary reward conditioning (both responses,
  # after a positive / negative control line; answers after the positive one): SFT settings on
  # the comparison files of task=rm, starting from the SFT policy.
  sft_like = dict(batch_size=32, steps=125, lr=1e-3, warmup_steps=0, schedule="cosine",
                  end_lr_frac=0.1, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
                  skip_nonfinite=0, log_every=25, eval_every=125, eval_batches=4)
  c.feedme = dict(sft_like)
  c.reward_conditioning = dict(sft_like, steps=250, positive="Quality: good",
                               negative="Quality: bad")

  # Quark, top-quantile variant: each round the policy answers prompts_per_round unlabeled posts
  # after `control`; the RM's top 1/num_bins answers become the pool (reset every round); then
  # steps_per_round steps of NLL + kl_coef * KL to SFT.
  c.quark = dict(rounds=4, prompts_per_round=512, sample_batch_size=256, num_bins=5,
                 temperature=1.0, control="Reward: top", kl_coef=0.05, steps_per_round=8,
                 batch_size=32, lr=3e-4, warmup_steps=0, schedule="constant", end_lr_frac=1.0,
                 b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0, skip_nonfinite=0)

  # DPO on the comparison files of task=rm, from and against the SFT policy: loss_type 'sigmoid'
  # (DPO, with optional label smoothing), 'ipo' or 'simpo' (reference-free; gamma_beta_ratio is
  # its margin over beta, read by 'simpo' only).
  c.dpo = dict(beta=0.1, loss_type="sigmoid", label_smoothing=0.0, gamma_beta_ratio=0.5,
               batch_size=32, epochs=1.0, lr=1e-4, warmup_steps=10, schedule="linear",
               end_lr_frac=0.0, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0, grad_clip=1.0,
               skip_nonfinite=0, log_every=10)
  # SimPO (Meng et al. 2024; task=simpo runs dpo.py under this block, from SFT, no reference):
  # loss -log sigmoid(beta/|y_c| log pi(y_c) - beta/|y_r| log pi(y_r) - gamma_beta_ratio * beta),
  # with optional label smoothing. beta 2.0 and gamma_beta_ratio 0.5: the SimPO repository's
  # recommended start (its README; Llama3-Base used exactly these). Optimiser settings as DPO's.
  c.simpo = dict(c.dpo, loss_type="simpo", beta=2.0, gamma_beta_ratio=0.5)
  # KTO (Ethayarajh et al. 2024; task=kto) on binary feedback, from and against the SFT policy.
  # With r = log pi(y|x) - log pi_ref(y|x) and z0 = max(0, the batch mean of that log-ratio on
  # mismatched pairs, each prompt with the previous row's response), no gradient through z0:
  # desirable_weight * (1 - sigmoid(beta (r - z0))) for a desirable response,
  # undesirable_weight * (1 - sigmoid(beta (z0 - r))) for an undesirable one, averaged.
  # beta 0.1, both weights 1.0: TRL's KTOConfig. The paper's Eq. 8 wants desirable_weight x
  # desirable / (undesirable_weight x undesirable) in [1, 4/3]; the run says when it is not.
  # feedback: 'pairs' (the comparison files of task=rm: each chosen response desirable, each
  # rejected one undesirable, as in the paper's experiments) | 'binary' (a binary-layout file:
  # train_file, '' for task=label's with label.protocol=binary). batch_size counts responses: 64,
  # the sequences of DPO's 32 pairs, in as many steps; the optimiser as DPO's.
  c.kto = dict(beta=0.1, desirable_weight=1.0, undesirable_weight=1.0, feedback="pairs",
               train_file="", batch_size=64, epochs=1.0, lr=1e-4, warmup_steps=10,
               schedule="linear", end_lr_frac=0.0, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0,
               grad_clip=1.0, skip_nonfinite=0, log_every=10)

  # task=compile: lower and compile every step of `steps` for each TPU slice of `topology`
  # (comma-separated, e.g. 'v5e:4x4,v5p:2x2x2'; needs pip install -e '.[tpu]', no TPU): per-chip
  # bytes from XLA against the chip's HBM less `headroom`, analytic FLOPs, roofline time, MFU.
  # With mesh.auto the planner ranks the slice's mesh shapes and the best `auto_candidates` compile.
  # The critic-free updates (rloo_update, grpo_update, dapo_update, gspo_update,
  # reinforce_pp_update) compile when named here; left out by default, as the default stages do
  # not run them and mesh.auto would choose a mesh for them too.
  # With rollout.placement='split' the report adds the asynchronous iteration: the slice divided
  # into trainer and sampler chips at rollout.sampler_share and at each share of `split_shares`
  # (fractions of the slice's chips), ranked by an analytic estimate, the best auto_candidates
  # compiled (the update on the trainer's chips, prefill and decode on the sampler's, the push).
  c.compile = dict(topology="",
                   steps="sft,rm,dpo,simpo,kto,ppo_prefill,ppo_decode,ppo_update,best_of_n_score",
                   headroom=0.05, auto_candidates=3, split_shares="0.125,0.25,0.375,0.5")

  # task=seeds (rlhfjax/stages/seeds.py): `run_seeds` the run seeds; each seed s runs `stages` in
  # <workdir>/seed_<s> with seed=s (model init, batch order, samples, label and judge draws), then
  # <workdir>/seeds/summary.md gives each method's leaderboard numbers as mean ± sd over the seeds
  # and the orderings of methods that hold in every seed. world=True also sets data.seed and
  # annotators.seed to s (another simulated world and annotator pool); the default keeps the world
  # fixed, so every seed's methods are judged on the same test set by the same pool.
  c.seeds = dict(run_seeds="0,1,2", world=False)

  # LoRA adapters (rlhfjax/models/lora.py): rank 0 trains every weight. With rank r > 0 the
  # models named in `models` (sft | rm | policy: every preference/RL method's | value: PPO's
  # critic) train only rank-r adapters W + (alpha / r) A B on the projections in `targets`
  # (q,k,v,o attention; wi,wg,wo MLP) and their scalar heads; the reference policy is the policy
  # with its adapters off (one backbone); later stages and export read the adapters merged.
  # Adapters learn at higher rates than full fine-tuning: raise the method's lr with them.
  c.lora = dict(rank=0, alpha=16.0, targets="q,k,v,o,wi,wg,wo", models="sft,rm,policy,value")

  # Checkpoints: every `every` steps, keep the last `keep`; a rerun in the workdir resumes.
  c.checkpoint = dict(every=100, keep=2)

  # task=export: a finished run (sft | expert_iteration | feedme | reward_conditioning | ppo | dpo |
  # simpo | rloo | grpo | dapo | gspo | reinforce_pp | online_dpo | rm) as a Hugging Face directory
  # (default <workdir>/export/<model>); dtype '' keeps each tensor's.
  c.export = dict(model="ppo", directory="", dtype="")

  if arg == "tiny":
    c.data.update(sft=256, pref=64, unlabeled=64, validation=32, test=32)
    c.tokenizer.update(vocab_size=400, train_examples=256, split_by_unicode_script=True)
    c.format.update(response_len=32)
    c.model.update(d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=64, max_len=160)
    c.sft.update(batch_size=8, steps=8, warmup_steps=2, log_every=2, eval_every=4, eval_batches=1)
    c.label.update(num_pairs=32, num_val_pairs=16, batch_size=16)
    c.rm.update(batch_size=8, warmup_steps=1, log_every=2, eval_every=2, eval_batch_size=16,
                norm_examples=16, probe_examples=8, bootstrap=20)
    c.ppo.update(steps=4, rollout_batch=8, minibatch_size=4, eval_every=2, eval_examples=8)
    for block in (c.rloo, c.grpo, c.dapo, c.gspo, c.dr_grpo, c.reinforce_pp, c.online_dpo):
      block.update(steps=2, rollout_batch=8, eval_every=2, eval_examples=8)
    for block in (c.rloo, c.reinforce_pp):
      block.update(minibatch_size=4)
    for block in (c.grpo, c.dapo, c.gspo, c.dr_grpo):
      block.update(k=4, minibatch_size=4)
    c.checkpoint.update(every=4)
    c.best_of_n.update(n=4, batch_size=32)
    for block in (c.dpo, c.simpo, c.kto):
      block.update(batch_size=8, warmup_steps=1, log_every=2)
    c.quark.update(rounds=2, prompts_per_round=16, sample_batch_size=8, num_bins=4,
                   steps_per_round=2, batch_size=4)
    for block in (c.feedme, c.reward_conditioning):
      block.update(batch_size=8, steps=4, log_every=2, eval_every=2, eval_batches=1)
    c.expert_iteration.update(n=2, num_prompts=16, sample_batch_size=32, batch_size=8, steps=4,
                              log_every=2, eval_every=2, eval_batches=1)
    c.eval.update(num_examples=8, batch_size=8, show=1)
  elif arg:
    raise ValueError(f"unknown config argument {arg!r}; expected '' or 'tiny'")
  return c
