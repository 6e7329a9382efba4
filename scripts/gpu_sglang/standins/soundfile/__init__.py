"""Import stand-in for ``soundfile`` (scripts/gpu_sglang/standins): ``python -m sglang.launch_server`` imports it at
module level on its way to the HTTP server (entrypoints/http_server.py -> openai/serving_transcription.py ->
openai/audio_chunking.py: ``import soundfile as sf``), and the GPU machine has none. A text server never calls it:
every name is import-only (calling one raises, naming it). The real package is left out because, without cffi,
importing it fails inside transformers' audio import; this stand-in imports cleanly there (transformers then finds
a soundfile, imports it and calls nothing at import). Never part of eagle3-capture."""
import e3_standin_stubs as _stubs

__version__ = "0.0.0+e3standin"
STANDIN = True
__getattr__ = _stubs.module_getattr(__name__)
