# embed.cmake: turns a file into a C array initializer, so the binary carries it (the
# /dashboard page). Run at build time by gateway/CMakeLists.txt:
#   cmake -DIN=gateway/dashboard.html -DOUT=build/.../dashboard_html.inc -P gateway/embed.cmake
# OUT holds the bytes as "0x3c,0x21,..." lines, followed by no terminator: the includer adds
# the array declaration and takes its size with sizeof.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
if(n EQUAL 0)
    message(FATAL_ERROR "embed.cmake: ${IN} is empty")
endif()
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
# One line per 32 bytes keeps the generated file readable in a debugger.
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n" body "${body}")
file(WRITE "${OUT}.tmp" "${body}\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
