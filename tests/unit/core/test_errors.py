import pytest

from worldserve import errors


@pytest.mark.parametrize("cls, status, close", [
    (errors.InvalidRequest, 400, 1008),
    (errors.AuthenticationRequired, 401, 1008),
    (errors.PermissionDenied, 403, 1008),
    (errors.NotFound, 404, 1008),
    (errors.IdleTimeout, 408, 1008),
    (errors.Conflict, 409, 1008),
    (errors.PayloadTooLarge, 413, 1008),
    (errors.UnsupportedMediaType, 415, 1008),
    (errors.NotSupported, 501, 1011),
    (errors.UpstreamError, 502, 1011),
    (errors.CapacityExceeded, 503, 1008),
    (errors.StageUnavailable, 503, 1011),
    (errors.RequestTimeout, 504, 1011),
    (errors.InternalError, 500, 1011),
])
def test_table(cls: type[errors.WorldserveError], status: int, close: int) -> None:
    exc = cls("message")
    assert errors.http_status(exc) == status
    assert errors.ws_close_code(exc) == close


def test_subclass_inherits_its_parents_mapping() -> None:
    class Special(errors.NotFound):
        pass

    assert errors.http_status(Special("x")) == 404


def test_codes_round_trip_across_processes() -> None:
    for cls in (errors.InvalidRequest, errors.CapacityExceeded, errors.RequestTimeout):
        rebuilt = errors.from_code(cls.code, "why")
        assert type(rebuilt) is cls and rebuilt.message == "why"
    assert isinstance(errors.from_code("no-such-code", "x"), errors.InternalError)


def test_body_is_openai_shaped() -> None:
    body = errors.error_body(errors.InvalidRequest("size must be WxH", param="size"))
    assert body == {"error": {"message": "size must be WxH", "type": "invalid_request_error",
                              "code": "invalid_request", "param": "size"}}


def test_invalid_request_is_a_value_error() -> None:
    assert isinstance(errors.InvalidRequest("x"), ValueError)


def test_close_codes_are_the_streaming_specs_rule() -> None:
    """One mapping: 1008 for client-side and admission errors, 1011 for failures on our side
    (streaming-reasoning §8.4), for every class of the taxonomy."""
    for cls in (errors.InvalidRequest, errors.NotFound, errors.IdleTimeout, errors.Conflict,
                errors.PayloadTooLarge, errors.UnsupportedMediaType, errors.CapacityExceeded,
                errors.NotSupported, errors.UpstreamError, errors.StageUnavailable,
                errors.RequestTimeout, errors.InternalError):
        exc = cls("x")
        client_side = errors.http_status(exc) < 500 or isinstance(exc, errors.CapacityExceeded)
        assert errors.ws_close_code(exc) == (1008 if client_side else 1011)
