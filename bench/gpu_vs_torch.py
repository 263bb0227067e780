#!/usr/bin/env python3
"""PyTorch eager on the GPU: the reference for bench/gpu_model_bench.cc.

Times torchvision's resnet50 and vgg19 (the layers and shapes of the zoo's ResNet-50 v1.5 and
VGG-19, which reefline runs) and BERT-base at sequence length --seq (Hugging Face's BertModel
where transformers is installed, else the same dimensions from torch.nn: 12 encoder layers of
768 with 12 heads and a 3072 GELU FFN over token and position embeddings, then the pooler and
an 8-label head, as the zoo's `bert`) in eval mode under torch.inference_mode(), input already
on the GPU, one forward pass per timed run, synchronised: the counterpart of gpu_model_bench's
kernels_ms. Weights are random: timing does not depend on them.

Math: fp32 with TF32 off (cudnn and matmul), as reefline's fp32 path computes; --tf32 also
times PyTorch's default for convolutions (TF32 on tensor cores), for information.

Lines: `torch model=M batch=B ms=X math=fp32|tf32`. Exit 77 when there is no CUDA GPU or no
torch/torchvision.
"""
import argparse
import statistics
import sys
import time


def bert_base(torch, seq):
    """BERT-base as a callable of token ids [batch, seq], and where it came from."""
    try:
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(num_labels=8, max_position_embeddings=max(512, seq)))
        head = torch.nn.Linear(768, 8)

        class classifier(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert, self.head = model, head

            def forward(self, ids):
                return self.head(self.bert(input_ids=ids, attention_mask=torch.ones_like(ids)).pooler_output)

        return classifier(), "transformers.BertModel"
    except ImportError:
        pass
    nn = torch.nn

    class encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions, self.types = nn.Embedding(30522, 768), nn.Embedding(512, 768), nn.Embedding(2, 768)
            self.norm = nn.LayerNorm(768, eps=1e-12)
            layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
            self.layers = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
            self.pooler, self.head = nn.Linear(768, 768), nn.Linear(768, 8)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            h = self.norm(self.tokens(ids) + self.positions(pos) + self.types(torch.zeros_like(ids)))
            h = self.layers(h)
            return self.head(torch.tanh(self.pooler(h[:, 0])))

    return encoder(), "torch.nn (BERT-base dimensions)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,vgg19,bert")
    ap.add_argument("--seq", type=int, default=128, help="BERT's sequence length")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--tf32", action="store_true", help="also time with TF32 allowed")
    args = ap.parse_args()
    try:
        import torch
        import torchvision
    except ImportError as e:
        print(f"gpu_vs_torch: {e}", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("gpu_vs_torch: no CUDA device for torch", file=sys.stderr)
        return 77
    dev = torch.device("cuda")
    print(f"gpu_vs_torch: torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{torch.cuda.get_device_name(0)}", flush=True)
    maths = ["fp32"] + (["tf32"] if args.tf32 else [])
    for name in args.models.split(","):
        if name == "bert":
            model, source = bert_base(torch, args.seq)
            model = model.eval().to(dev)
            print(f"gpu_vs_torch: bert from {source}, sequence length {args.seq}", flush=True)
        else:
            model = getattr(torchvision.models, name)(weights=None).eval().to(dev)
        for batch in (int(b) for b in args.batches.split(",")):
            if name == "bert":
                x = torch.randint(0, 1000, (batch, args.seq), device=dev)
            else:
                x = torch.randn(batch, 3, 224, 224, device=dev)
            for math in maths:
                tf32 = math == "tf32"
                torch.backends.cudnn.allow_tf32 = tf32
                torch.backends.cuda.matmul.allow_tf32 = tf32
                times = []
                with torch.inference_mode():
                    for _ in range(5):
                        model(x)
                    torch.cuda.synchronize()
                    for _ in range(args.iterations):
                        t0 = time.perf_counter()
                        model(x)
                        torch.cuda.synchronize()
                        times.append((time.perf_counter() - t0) * 1e3)
                print(f"torch model={name} batch={batch} ms={statistics.median(times):.3f} math={math}", flush=True)
        del model
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
