#!/usr/bin/env bash
# Multi-node training: run this same command on every node (by hand, pdsh, or a Slurm srun step).
#
#   NNODES=4 GPUS=8 MASTER=node01 JOB_ID=asr-$(date +%F) bash local/launch_multinode.sh
#   NNODES=4 GPUS=8 MASTER=node01 NODE_RANK=2 RDZV=static bash local/launch_multinode.sh
#
# Every node must see the same hyper-p.json and the shards it names: a shared file system
# (NFS/Lustre) at the same path on every node, or URLs (`pipe:curl ...`, `pipe:aws s3 cp ... -`)
# written into `ld` by `make_hyper.py --remote` (see ../README.md).  Extra arguments are passed to
# train.py, e.g. `--max-steps 100`.
#
# Variables:
#   NNODES    number of nodes (default 1)
#   GPUS      processes per node, usually one per GPU (default: GPUs seen, else 1)
#   MASTER    host name of the rendezvous node, reachable from all nodes (default localhost)
#   PORT      rendezvous port (default 29400)
#   JOB_ID    rendezvous id, the same on all nodes and unique per job (default wdsprep)
#   RDZV      c10d (default): ranks are assigned at rendezvous, nodes may start in any order and
#             torchrun can restart failed workers (MAX_RESTARTS).  static: classic fixed ranks,
#             needs NODE_RANK=0..NNODES-1 on each node and MASTER as the rank-0 node.
#   HYPER     hyper-p.json (default exp/large/hyper-p.json);  EXP: checkpoint dir (default its folder)
set -euo pipefail

cd "$(dirname "$0")/.."  # egs/large: train.py and relative paths in HYPER resolve from here

nnodes=${NNODES:-1}
gpus=${GPUS:-$(python -c 'import torch; print(max(torch.cuda.device_count(), 1))')}
master=${MASTER:-localhost}
port=${PORT:-29400}
job_id=${JOB_ID:-wdsprep}
rdzv=${RDZV:-c10d}
hyper=${HYPER:-exp/large/hyper-p.json}
exp=${EXP:-$(dirname "$hyper")}
max_restarts=${MAX_RESTARTS:-0}
# CPU-only nodes: one math thread per rank unless told otherwise, so ranks do not oversubscribe.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

case "$rdzv" in
  c10d)
    launcher=(torchrun --nnodes="$nnodes" --nproc-per-node="$gpus"
              --rdzv-backend=c10d --rdzv-endpoint="$master:$port" --rdzv-id="$job_id"
              --max-restarts="$max_restarts") ;;
  static)
    [ -n "${NODE_RANK:-}" ] || { echo "$0: RDZV=static needs NODE_RANK (0..$((nnodes - 1)))" >&2; exit 1; }
    launcher=(torchrun --nnodes="$nnodes" --node-rank="$NODE_RANK" --nproc-per-node="$gpus"
              --master-addr="$master" --master-port="$port") ;;
  *)
    echo "$0: RDZV must be c10d or static, got $rdzv" >&2; exit 1 ;;
esac

echo "$0: $(hostname): ${launcher[*]} local/train.py --hyper $hyper --exp-dir $exp $*"
exec "${launcher[@]}" local/train.py --hyper "$hyper" --exp-dir "$exp" "$@"
