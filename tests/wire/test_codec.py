"""Payloads: large ``bytes`` and ``bytearray`` travel as out-of-band buffers, small
objects as plain pickles, and everything comes back equal and of the same type."""
from __future__ import annotations

import io
import pickle
import sys
import traceback

import cloudpickle
import pytest

import jobs

from fiberlite.pool import Pool
from fiberlite.pool.chunks import pack, unpack
from fiberlite.wire import codec
from fiberlite.wire.codec import OUT_OF_BAND_MIN, Payload

pytestmark = pytest.mark.timeout(60)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

LARGE = bytes(range(256)) * (OUT_OF_BAND_MIN // 256 + 1)  # just over the threshold
SMALL = b"small bytes"


def _through_the_wire(payload: Payload, writable: bool) -> Payload:
    """The payload as a receiver gets it: in an envelope, encoded, then decoded from a
    frame that is either a copy (bytes) or the received message used in place."""
    frame = codec.encode(("reply", payload))
    frame = bytes(frame.bytes if hasattr(frame, "bytes") else frame)
    kind, received = codec.decode(bytearray(frame) if writable else frame)
    assert kind == "reply"
    return received


@pytest.mark.parametrize("obj", [LARGE, bytearray(LARGE), bytes(4 * OUT_OF_BAND_MIN)],
                         ids=["bytes", "bytearray", "256KiB"])
def test_large_bytes_travel_out_of_band(obj):
    payload = Payload.pack(obj)
    assert len(payload.buffers) == 1
    assert memoryview(payload.buffers[0]).nbytes == len(obj)
    assert len(payload.data) < 100  # the content is not in the pickle
    back = payload.unpack()
    assert type(back) is type(obj) and back == obj
    assert back is not obj


@pytest.mark.parametrize("obj", [SMALL, bytearray(SMALL), bytes(OUT_OF_BAND_MIN - 1), b""],
                         ids=["bytes", "bytearray", "just-below", "empty"])
def test_small_bytes_stay_in_the_pickle(obj):
    payload = Payload.pack(obj)
    assert payload.buffers == []
    back = payload.unpack()
    assert type(back) is type(obj) and back == obj


def test_nested_large_bytes_each_get_a_buffer():
    other = bytes(2 * OUT_OF_BAND_MIN)
    obj = {"a": [LARGE, SMALL, (1, other)], "b": {"array": bytearray(LARGE)}, "c": "text"}
    payload = Payload.pack(obj)
    assert sorted(memoryview(b).nbytes for b in payload.buffers) == sorted([len(LARGE), len(other),
                                                                             len(LARGE)])
    back = payload.unpack()
    assert back == obj
    assert type(back["a"][0]) is bytes and type(back["a"][2][1]) is bytes
    assert type(back["b"]["array"]) is bytearray


def test_nested_small_bytes_use_no_buffer():
    obj = [SMALL, {"k": bytearray(SMALL)}, (SMALL, 1)]
    payload = Payload.pack(obj)
    assert payload.buffers == []
    assert payload.unpack() == obj


def test_large_str_stays_in_the_pickle():
    text = "x" * (2 * OUT_OF_BAND_MIN)
    payload = Payload.pack([text, text + "y"])
    assert payload.buffers == []
    assert payload.unpack() == [text, text + "y"]


def test_unpacked_bytes_are_immutable_and_bytearrays_are_copies():
    array = bytearray(LARGE)
    back_bytes, back_array = Payload.pack([LARGE, array]).unpack()
    with pytest.raises(TypeError):
        back_bytes[0] = 1  # type: ignore[index]
    back_array[0] = 255
    assert array[0] == 0 and back_array[0] == 255


def test_one_object_twice_is_sent_once_and_shared():
    array = bytearray(LARGE)
    payload = Payload.pack([array, array, LARGE, LARGE])
    assert len(payload.buffers) == 2
    a1, a2, b1, b2 = payload.unpack()
    assert a1 is a2 and b1 is b2  # as pickle does for every object
    assert a1 == array and b1 == LARGE


def test_functions_and_classes_still_travel_by_value_next_to_large_bytes():
    class Local:
        def __init__(self, value):
            self.value = value

    scale = 3
    payload = Payload.pack([lambda x: x * scale, Local(LARGE)])
    assert len(payload.buffers) == 1
    func, obj = payload.unpack()
    assert func(2) == 6
    assert type(obj).__name__ == "Local" and obj.value == LARGE and type(obj.value) is bytes


@pytest.mark.parametrize("writable", [False, True])
def test_round_trip_through_a_frame(writable):
    obj = [LARGE, bytearray(LARGE), {"small": SMALL}]
    received = _through_the_wire(Payload.pack(obj), writable)
    back = received.unpack()
    assert back == obj
    assert [type(x) for x in back] == [bytes, bytearray, dict]


def test_pool_worker_packs_large_results_out_of_band():
    packed = pack([LARGE, bytearray(LARGE)])
    assert isinstance(packed, Payload) and len(packed.buffers) == 2
    assert unpack(packed) == [LARGE, bytearray(LARGE)]
    small = pack([SMALL, (SMALL, 1)])
    assert type(small) is bytes  # the plain fast path
    assert unpack(small) == [SMALL, (SMALL, 1)]
    assert type(pack([[LARGE]])) is Payload


def test_an_unknown_persistent_id_is_refused():
    class Sneaky(pickle.Pickler):
        def persistent_id(self, obj):
            return "os.system" if obj == "x" else None

    file = io.BytesIO()
    Sneaky(file, protocol=5).dump(["x"])
    with pytest.raises(pickle.UnpicklingError):
        Payload(file.getvalue(), [b"buffer"]).unpack()


def make_bytes(n):
    return bytes([n % 256]) * (2 * OUT_OF_BAND_MIN)


def make_bytearray(n):
    return bytearray(make_bytes(n))


def test_pool_returns_large_bytes_and_bytearrays():
    with Pool(2) as pool:
        results = pool.map(make_bytes, range(6), chunksize=1)
        assert results == [make_bytes(n) for n in range(6)]
        assert all(type(r) is bytes for r in results)
        arrays = pool.map(make_bytearray, range(3))
        assert arrays == [make_bytearray(n) for n in range(3)]
        assert all(type(r) is bytearray for r in arrays)
        assert pool.apply(make_bytes, (7,)) == make_bytes(7)
    pool.join()


@pytest.mark.parametrize("pickled", [codec.dumps_bytes, lambda f: Payload.pack(f)])
def test_functions_pickled_by_value_keep_their_file_name(tmp_path, pickled):
    script = tmp_path / "user_script.py"
    outer = jobs.load_script(script, "def outer(x):\n    def inner():\n        return 1 / x\n    return inner()\n")["outer"]
    data = pickled(outer)
    loaded = data.unpack() if isinstance(data, Payload) else pickle.loads(data)
    assert loaded is not outer and loaded.__code__.co_filename == str(script)
    with pytest.raises(ZeroDivisionError) as info:
        loaded(0)
    frames = traceback.extract_tb(info.value.__traceback__)[-2:]
    assert [f.filename for f in frames] == [str(script)] * 2  # nested code too
    assert frames[-1].line == "return 1 / x"


@pytest.mark.parametrize("envelope", [
    lambda p: (True, p),                       # a reply carrying an item
    lambda p: (7, "send", (1, p)),             # a call with the item among its arguments
    lambda p: (3, "put", (p, True, None)),
])
@pytest.mark.parametrize("payload", [Payload.pack({"small": [1, 2]}), Payload.raw(b"raw bytes")])
def test_a_small_payload_rides_after_its_envelope_as_its_own_bytes(envelope, payload):
    message = envelope(payload)
    frame = codec.encode(message, codec.NO_REPLY)
    assert codec.flags_of(frame) == codec.NO_REPLY
    assert frame.endswith(payload.data)  # the item's pickle as it is: never pickled twice
    loaded = codec.decode(frame)
    flat = [x for part in loaded for x in (part if type(part) is tuple else (part,))]
    got = next(x for x in flat if type(x) is Payload)
    assert got.is_raw == payload.is_raw and got.as_bytes() == payload.as_bytes()
    assert [x for x in flat if type(x) is not Payload] == \
        [x for part in message for x in (part if type(part) is tuple else (part,)) if type(x) is not Payload]


def test_a_payload_with_buffers_is_not_inlined():
    payload = Payload.pack(b"x" * OUT_OF_BAND_MIN)
    frame = codec.encode((True, payload))
    assert type(frame) is not bytes  # one nng message with the buffer out of band
    assert codec.decode(codec.frame_from_message(frame))[1].unpack() == b"x" * OUT_OF_BAND_MIN
