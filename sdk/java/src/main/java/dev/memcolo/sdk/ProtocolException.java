package dev.memcolo.sdk;

/**
 * A line that cannot be decoded (docs/protocol.md §7). {@link #code()} is the error
 * code a receiver answers it with: {@code bad_request} or {@code unsupported_version}.
 */
public final class ProtocolException extends Exception {
    private static final long serialVersionUID = 1L;
    private final String code;

    public ProtocolException(String code, String message) {
        super(message);
        this.code = code;
    }

    public String code() {
        return code;
    }
}
