# LLaMA-2 7B's shape (Touvron et al. 2023, "Llama 2", and its released config.json):
# 32 layers of width 4096, 32 heads, SwiGLU MLP of hidden size 11008, RMSNorm before
# each sublayer, rotary positions, no biases, separate input and output embeddings,
# a 32,000-token vocabulary and a 4,096-token context.
#
#     python lab.py params configs/llama2_7b.py  # 6,738,415,616 parameters
#
# Model shape only: far too big to train on one GPU with this project.
block_size = 4096
vocab_size = 32000
n_layer = 32
n_head = 32
n_embd = 4096
bias = False
pos_encoding = "rope"
rope_theta = 10000.0
norm = "rmsnorm"
mlp = "swiglu"
mlp_hidden = 11008
tie_embeddings = False
