"""The server dump (``EAGLE3_CAPTURE_DUMP=<dir>``): the one definition of its records, their one validator and their
one reader. The SGLang plugin writes records (sglang/dump*.py); the doctor, the tests and the GPU report read them
here.

* ``contract``: file names, the keys of a record and what each holds, the validator (:func:`record_problems` for
  version 2, :func:`v1_record_problems` for the plugin's older records);
* ``reader``: a record file loaded and checked by that validator into a :class:`DumpRecord`, a directory read as a
  live server fills it (:class:`DumpReader`), and one request's rows stitched across records.
"""
from .contract import (CONVENTIONS, DOCTOR_RID_PREFIX, FIELDS, FILE_RE, FORMAT, RANK_FIELDS, REQUEST_FIELDS, STREAM_ALL,
                       STREAM_DECLARED, STREAM_MODES, TMP_SUFFIX, V1_FILE_RE, DumpError, DumpRecordError, file_name,
                       is_doctor_rid, record_problems, v1_record_problems, validate_record)
from .reader import DumpReader, DumpRecord, dump_files, load_record, read_record

__all__ = ["FORMAT", "DOCTOR_RID_PREFIX", "TMP_SUFFIX", "FILE_RE", "V1_FILE_RE", "STREAM_DECLARED", "STREAM_ALL",
           "STREAM_MODES", "CONVENTIONS", "FIELDS", "REQUEST_FIELDS", "RANK_FIELDS", "DumpError", "DumpRecordError",
           "file_name", "is_doctor_rid", "record_problems", "v1_record_problems", "validate_record", "DumpRecord",
           "DumpReader", "dump_files", "read_record", "load_record"]
