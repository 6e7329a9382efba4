"""The server dump (``EAGLE3_CAPTURE_DUMP=<dir>``): the one definition of its records, their one validator and their
one reader. The SGLang plugin writes records (sglang/dump*.py); the doctor, the tests and the GPU report read them
here.

* ``contract``: file names, the keys of a record and what each holds, the validator (:func:`record_problems` for
  versions 3 and 2, :func:`v1_record_problems` for the plugin's oldest records);
* ``reader``: a record file loaded and checked by that validator into a :class:`DumpRecord`, a directory read as a
  live server fills it (:class:`DumpReader`), and one request's rows stitched across records;
* ``inventory``: records grouped by capture declaration, each with its writing processes (replicas sharing a
  directory).
"""
from .contract import (CONVENTIONS, DOCTOR_RID_PREFIX, FIELDS, FIELDS_V2, FILE_RE, FORMAT, FORMAT_V2, FORMATS,
                       RANK_FIELDS, REQUEST_FIELDS, SERVER_FIELDS, SERVER_RE, STREAM_ALL, STREAM_DECLARED, STREAM_MODES,
                       TMP_SUFFIX, V1_FILE_RE, V2_FILE_RE, DumpError, DumpRecordError, file_name, host_in_name,
                       is_doctor_rid, record_problems, v1_record_problems, validate_record)
from .inventory import DumpInventory, inventory
from .reader import DumpReader, DumpRecord, dump_files, load_record, read_record

__all__ = ["FORMAT", "FORMAT_V2", "FORMATS", "DOCTOR_RID_PREFIX", "TMP_SUFFIX", "SERVER_RE", "FILE_RE", "V2_FILE_RE",
           "V1_FILE_RE", "STREAM_DECLARED", "STREAM_ALL", "STREAM_MODES", "CONVENTIONS", "FIELDS", "FIELDS_V2",
           "SERVER_FIELDS", "REQUEST_FIELDS", "RANK_FIELDS", "DumpError", "DumpRecordError", "host_in_name",
           "file_name", "is_doctor_rid", "record_problems", "v1_record_problems", "validate_record", "DumpRecord",
           "DumpReader", "dump_files", "read_record", "load_record", "DumpInventory", "inventory"]
