#!/usr/bin/env python3
"""PyTorch eager on the GPU: the reference for bench/gpu_model_bench.cc.

Times torchvision's resnet50 and vgg19 (the layers and shapes of the zoo's ResNet-50 v1.5 and
VGG-19, which reefline runs) in eval mode under torch.inference_mode(), input already on the
GPU, one forward pass per timed run, synchronised: the counterpart of gpu_model_bench's
kernels_ms. Weights are random (torchvision's init): timing does not depend on them.

Math: fp32 with TF32 off (cudnn and matmul), as reefline's fp32 path computes; --tf32 also
times PyTorch's default for convolutions (TF32 on tensor cores), for information.

Lines: `torch model=M batch=B ms=X math=fp32|tf32`. Exit 77 when there is no CUDA GPU or no
torch/torchvision.
"""
import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,vgg19")
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
        model = getattr(torchvision.models, name)(weights=None).eval().to(dev)
        for batch in (int(b) for b in args.batches.split(",")):
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
