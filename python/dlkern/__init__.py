"""dlkern's Python tools: `dlkern.retarget` (move an ONNX model's nodes to dlkern's ops) and
`dlkern.synth` (builder-shaped LLM graphs with random weights, for shapes no fixture covers).

The C ABI wrapper and the ONNX test-model helpers are the modules `dlkern_ctypes` and
`dlkern_onnx` beside this package."""
