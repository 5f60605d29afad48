-- wrk script for bench/rpc/run.sh: GET / on wasmtime serve, checking each body is "hello".
local threads = {}

function setup(thread)
   table.insert(threads, thread)
end

function init(args)
   bad = 0
end

function response(status, headers, body)
   if status ~= 200 or body ~= "hello" then
      bad = bad + 1
      if bad == 1 then
         io.stderr:write("first bad response: " .. status .. " " .. string.sub(body, 1, 300) .. "\n")
      end
   end
end

function done(summary, latency, requests)
   local total = 0
   for _, t in ipairs(threads) do
      total = total + t:get("bad")
   end
   io.write(string.format("bad responses: %d\n", total))
end
