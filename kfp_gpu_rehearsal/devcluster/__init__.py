"""Build and boot a local Kubernetes control plane (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK, Kubeflow Training Operator v1)
without Docker. See docs/local-cluster.md."""
